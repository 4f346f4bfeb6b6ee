"""`wordle-mlx export`'s llama.cpp grammar, usage notes and Ollama choice, checked in pure Python and in llama.cpp.

The tiny model with a random LoRA adapter is exported twice: as an adapter that records nothing (grammar
decoding, a Modelfile) and as one that records words decoding with untrained tags (the words grammar, no
Modelfile). Each grammar is read by `gbnf.GbnfMatcher` and, when llama-cpp-python is installed, by llama.cpp
itself (`llama_sampler_init_grammar` on the tiny GGUF's vocabulary): a legal reply must be accepted token by
token and then allow the end of generation; a non-word (words) and a missing tag (grammar) must not. llama.cpp
also plays the tiny GGUF greedily with `LlamaGrammar.from_file`, and its reply must be legal. `--ollama` with the
untrained-tags adapter must exit 2 with one line and write nothing.
"""

from __future__ import annotations

import ctypes
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr
from pathlib import Path

from tests.test_export import make_adapter
from wordle_mlx.errors import UserError
from wordle_mlx.game.words import guess_list
from wordle_mlx.llm.play.gbnf import GbnfMatcher, ReplyPieces, reply_pieces
from wordle_mlx.llm.model.models import load_model, load_tokenizer, resolve_model
from wordle_mlx.llm.play.reply_grammar import decoding_record
from wordle_mlx.stages import export

ROOT = Path(__file__).resolve().parent.parent
HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
NO_LLAMA_CPP = ("llama-cpp-python is not installed (it compiles llama.cpp: pip install llama-cpp-python==0.3.36, "
                "or run make llamacpp-check, which builds it in .venv-llamacpp)")
LEGAL = "<guess> c r a n e</guess>"
NON_WORD = "<guess> c r a n x</guess>"
NO_CLOSING_TAG = "<guess> c r a n e"
NO_OPENING_TAG = " c r a n e</guess>"
ANY_LETTERS = "<guess> x q z z j</guess>"


def export_tiny(adapter: Path, out: Path, **options) -> dict:
    with redirect_stderr(io.StringIO()):
        return export.run(export.ExportConfig(adapter=str(adapter), out=str(out), json_output=True, **options))


class GrammarExportCase(unittest.TestCase):
    """The two tiny exports, made once for the module (`setUpModule`)."""

    @classmethod
    def setUpClass(cls):
        for key, value in FIXTURE.items():
            setattr(cls, key, value)


FIXTURE: dict = {}


def setUpModule():
    tmp = tempfile.TemporaryDirectory()
    folder = Path(tmp.name)
    adapter, words_adapter = folder / "adapter", folder / "words-adapter"
    make_adapter("builtin:tiny-random", adapter)
    make_adapter("builtin:tiny-random", words_adapter)
    config = words_adapter / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **decoding_record("words", False)}))
    FIXTURE.update(tmp=tmp, dir=folder, adapter=adapter, words_adapter=words_adapter,
                   plain=export_tiny(adapter, folder / "plain.gguf"), words=export_tiny(words_adapter, folder / "words.gguf"),
                   grammar_text=(folder / "plain.gbnf").read_text(), words_text=(folder / "words.gbnf").read_text())


def tearDownModule():
    FIXTURE["tmp"].cleanup()


class ExportFilesTest(GrammarExportCase):
    def test_an_adapter_recording_nothing_gets_the_grammar_and_a_modelfile(self):
        self.assertEqual(self.plain["grammar_decode"], "grammar")
        self.assertTrue((self.dir / "plain.Modelfile").is_file())
        usage = (self.dir / "plain.llamacpp.md").read_text()
        self.assertIn("--grammar-file plain.gbnf", usage)
        self.assertIn("LlamaGrammar.from_file('plain.gbnf')", usage)
        self.assertIn("ollama create wordle -f plain.Modelfile", usage)

    def test_untrained_free_get_the_words_grammar_and_no_modelfile(self):
        self.assertEqual((self.words["grammar_decode"], self.words["modelfile"]), ("words", None))
        self.assertIn("never on its whole reply", self.words["no_modelfile_reason"])
        self.assertFalse((self.dir / "words.Modelfile").exists())
        usage = (self.dir / "words.llamacpp.md").read_text()
        self.assertIn("No Modelfile was written", usage)
        self.assertIn("cannot rule out the words already on the board", usage)

    def test_no_ollama_leaves_the_modelfile_out_and_overwrite_removes_an_old_one(self):
        out = self.dir / "again.gguf"
        export_tiny(self.adapter, out)
        self.assertTrue(out.with_suffix(".Modelfile").is_file())
        result = export_tiny(self.adapter, out, ollama=False, overwrite=True)
        self.assertIsNone(result["modelfile"])
        self.assertFalse(out.with_suffix(".Modelfile").exists())

    def test_ollama_with_untrained_free_exits_2_with_one_line_and_writes_nothing(self):
        out_dir = self.dir / "refused"
        out_dir.mkdir()
        proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "export", "--adapter", str(self.words_adapter),
                               "--out", str(out_dir / "x.gguf"), "--ollama"], capture_output=True, text=True, cwd=ROOT,
                              timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), "WORDLE_MLX_NO_REEXEC": "1"})
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        self.assertIn("--ollama", proc.stderr)
        self.assertIn("never on its whole reply", proc.stderr)
        self.assertEqual(list(out_dir.iterdir()), [])


class PurePythonGrammarTest(GrammarExportCase):
    def test_gemma_tokens_spell_the_reply_with_a_space_before_each_letter(self):
        tokenizer = load_tokenizer(Path(resolve_model("builtin:gemma-3-270m")), None)
        self.assertEqual(reply_pieces(tokenizer), ReplyPieces("<guess>", " ", "</guess>"))
        _, tiny = load_model("builtin:tiny-random")
        self.assertEqual(reply_pieces(tiny).reply("crane"), LEGAL)

    def test_grammar_accepts_any_letters_between_the_tags(self):
        matcher = GbnfMatcher(self.grammar_text)
        self.assertTrue(matcher.accepts(LEGAL))
        self.assertTrue(matcher.accepts(ANY_LETTERS))
        for bad in (NO_CLOSING_TAG, NO_OPENING_TAG, "<guess> c r a n</guess>", "<guess>crane</guess>"):
            self.assertFalse(matcher.accepts(bad), bad)

    def test_words_accepts_exactly_the_allowed_guesses(self):
        matcher = GbnfMatcher(self.words_text)
        pieces = ReplyPieces("<guess>", " ", "</guess>")
        words = guess_list()
        self.assertEqual(len(words), 12972)
        self.assertTrue(all(matcher.accepts(pieces.reply(w)) for w in words))
        for bad in (NON_WORD, ANY_LETTERS, NO_CLOSING_TAG, pieces.reply("zzzzz")):
            self.assertFalse(matcher.accepts(bad), bad)

    def test_malformed_grammar_is_a_one_line_error(self):
        with self.assertRaisesRegex(UserError, "undefined rule 'nowhere'"):
            GbnfMatcher('root ::= "<guess>" nowhere\n')
        with self.assertRaisesRegex(UserError, "g.gbnf:2: expected 'name ::= ...'"):
            GbnfMatcher('root ::= "a"\n"b" ::= "c"\n', "g.gbnf")


@unittest.skipUnless(HAVE_LLAMA_CPP, NO_LLAMA_CPP)
class LlamaCppGrammarTest(GrammarExportCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        import llama_cpp
        from llama_cpp import Llama

        cls.llama_cpp = llama_cpp
        cls.llm = Llama(model_path=str(cls.dir / "plain.gguf"), n_ctx=256, n_threads=1, verbose=False)
        cls.vocab = llama_cpp.llama_model_get_vocab(cls.llm.model)
        cls.end = llama_cpp.llama_vocab_eot(cls.vocab)

    def allowed(self, sampler, token: int) -> bool:
        lib = self.llama_cpp
        data = (lib.llama_token_data * 1)(lib.llama_token_data(token, 0.0, 0.0))
        candidates = lib.llama_token_data_array(data, 1, -1, False)
        lib.llama_sampler_apply(sampler, ctypes.byref(candidates))
        return not math.isinf(data[0].logit)

    def accepts(self, gbnf: str, text: str) -> bool:
        """llama.cpp's grammar allows each token of `text` in turn, then the end of generation."""
        lib = self.llama_cpp
        sampler = lib.llama_sampler_init_grammar(self.vocab, gbnf.encode("utf-8"), b"root")
        self.assertTrue(sampler, "llama.cpp could not parse the grammar")
        try:
            for token in self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False):
                if not self.allowed(sampler, token):
                    return False
                lib.llama_sampler_accept(sampler, token)
            return self.allowed(sampler, self.end)
        finally:
            lib.llama_sampler_free(sampler)

    def test_llama_cpp_reads_both_grammars_and_agrees_on_the_examples(self):
        self.assertTrue(self.llama_cpp.llama_vocab_is_eog(self.vocab, self.end))
        self.assertTrue(self.accepts(self.grammar_text, LEGAL))
        self.assertTrue(self.accepts(self.grammar_text, ANY_LETTERS))
        self.assertFalse(self.accepts(self.grammar_text, NO_CLOSING_TAG))
        self.assertFalse(self.accepts(self.grammar_text, NO_OPENING_TAG))
        self.assertTrue(self.accepts(self.words_text, LEGAL))
        self.assertFalse(self.accepts(self.words_text, NON_WORD))
        self.assertFalse(self.accepts(self.words_text, ANY_LETTERS))

    def test_greedy_play_with_the_grammar_file_gives_a_legal_reply(self):
        from llama_cpp import LlamaGrammar

        prompt = self.llm.tokenize(b"<start_of_turn>user\nNo clues yet.<end_of_turn>\n<start_of_turn>model\n",
                                   add_bos=True, special=True)
        allowed = set(guess_list())
        for name, text in (("plain.gbnf", self.grammar_text), ("words.gbnf", self.words_text)):
            with self.subTest(grammar=name):
                grammar = LlamaGrammar.from_file(str(self.dir / name), verbose=False)
                reply = []
                for token in self.llm.generate(prompt, temp=0.0, grammar=grammar):
                    if self.llama_cpp.llama_vocab_is_eog(self.vocab, token) or len(reply) >= 64:
                        break
                    reply.append(token)
                spelled = self.llm.detokenize(reply).decode("utf-8")
                self.assertTrue(GbnfMatcher(text).accepts(spelled), spelled)
                if name == "words.gbnf":
                    self.assertIn(spelled[len("<guess>"):-len("</guess>")].replace(" ", ""), allowed)


if __name__ == "__main__":
    unittest.main()

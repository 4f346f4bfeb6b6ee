"""`wordle-mlx export`'s llama.cpp grammar, usage notes and Ollama choice, checked in pure Python and in llama.cpp.

The tiny model with a random LoRA adapter is exported twice: as an adapter that records nothing (grammar
decoding, a Modelfile) and as one that records words decoding with untrained tags (the words grammar, no
Modelfile). Each grammar is read by `gbnf.GbnfMatcher` and, when llama-cpp-python is installed, by llama.cpp
itself (`llama_sampler_init_grammar` on the tiny GGUF's vocabulary): a legal reply must be accepted token by
token and then allow the end of generation; a non-word (words) and a missing tag (grammar) must not. llama.cpp
also plays the tiny GGUF greedily with `LlamaGrammar.from_file`, and its reply must be legal. `--ollama` with the
untrained-tags adapter must exit 2 with one line and write nothing. The logit bias written beside a grammar must
ban exactly the tokens outside the reply's own (the tags, the 26 letter tokens, the end of turn), and llama.cpp
playing with it must spell its reply with those tokens. `wordle-mlx grammar --board` must rule out the board's
words and nothing else, in pure Python and, node by node of the words' trie, in llama.cpp's own grammar sampler.
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
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from tests.test_export import make_adapter
from wordle_mlx.errors import UserError
from wordle_mlx.game.words import guess_list
from wordle_mlx.llm.play.gbnf import GbnfMatcher, ReplyPieces, reply_pieces
from wordle_mlx.llm.model.models import load_model, load_tokenizer, resolve_model
from wordle_mlx.llm.play.reply_grammar import LETTERS, WordTrie, decoding_record
from wordle_mlx.stages import export, grammar

ROOT = Path(__file__).resolve().parent.parent
HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
NO_LLAMA_CPP = ("llama-cpp-python is not installed (it compiles llama.cpp: pip install llama-cpp-python==0.3.36, "
                "or run make llamacpp-check, which builds it in .venv-llamacpp)")
LEGAL = "<guess> c r a n e</guess>"
NON_WORD = "<guess> c r a n x</guess>"
NO_CLOSING_TAG = "<guess> c r a n e"
NO_OPENING_TAG = " c r a n e</guess>"
ANY_LETTERS = "<guess> x q z z j</guess>"
BOARD = "crane:XYXXG,sloth"


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
    with redirect_stdout(io.StringIO()) as board_text:
        grammar.run(grammar.GrammarConfig(board=BOARD, model="builtin:tiny-random"))
    FIXTURE.update(tmp=tmp, dir=folder, adapter=adapter, words_adapter=words_adapter, board_text=board_text.getvalue(),
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


class LogitBiasTest(GrammarExportCase):
    def reply_vocabulary(self) -> set[int]:
        """The reply's tokens, read off the tiny tokenizer directly: the tags, each letter's tokens (a space token
        and the letter in the tiny vocabulary), <end_of_turn>."""
        _, tokenizer = load_model("builtin:tiny-random")
        enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        letters = {t for c in LETTERS for t in enc(f"<guess> {c}")[len(enc("<guess>")):]}
        self.assertEqual(len(letters), 27)       # the space and 26 letters
        return {*enc("<guess>"), *enc("</guess>"), *letters, tokenizer.get_vocab()["<end_of_turn>"]}

    def test_the_bias_bans_exactly_the_tokens_outside_the_reply(self):
        for name, result in (("plain", self.plain), ("words", self.words)):
            with self.subTest(export=name):
                bias = json.loads((self.dir / f"{name}.logit_bias.json").read_text())
                self.assertEqual(result["logit_bias"].rsplit("/", 1)[-1], f"{name}.logit_bias.json")
                self.assertTrue(all(value is False for _, value in bias))
                banned = [token for token, _ in bias]
                self.assertEqual(len(banned), len(set(banned)))
                self.assertEqual(set(banned), set(range(result["vocab"])) - self.reply_vocabulary())

    def test_the_usage_notes_pass_the_bias_and_a_board_grammar(self):
        usage = (self.dir / "words.llamacpp.md").read_text()
        self.assertIn("--slurpfile bias words.logit_bias.json", usage)
        self.assertIn('"logit_bias": $bias[0]', usage)
        self.assertIn("json.load(open('words.logit_bias.json'))", usage)
        self.assertIn("wordle-mlx grammar --model builtin:tiny-random --board crane,sloth", usage)
        self.assertIn("Ollama takes none", usage)
        self.assertNotIn("A board's own grammar", (self.dir / "plain.llamacpp.md").read_text())


class BoardGrammarTest(GrammarExportCase):
    def test_the_board_grammar_rules_out_the_board_words_and_nothing_else(self):
        matcher = GbnfMatcher(self.board_text)
        pieces = ReplyPieces("<guess>", " ", "</guess>")
        for word in guess_list():
            self.assertEqual(matcher.accepts(pieces.reply(word)), word not in ("crane", "sloth"), word)

    def test_a_bad_board_is_a_one_line_error_and_writes_nothing(self):
        for board, expected in (("crane,xyzzy", "'xyzzy' is not an allowed guess"), ("cran", "has 4 letters"),
                                ("crane:GGGG", "tiles 'GGGG' are not 5 of G, Y, X")):
            out = self.dir / "bad.gbnf"
            proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "grammar", "--board", board, "--model",
                                   "builtin:tiny-random", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                                  timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), "WORDLE_MLX_NO_REEXEC": "1"})
            with self.subTest(board=board):
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
                self.assertTrue(proc.stderr.startswith("error: --board: "), proc.stderr)
                self.assertIn(expected, proc.stderr)
                self.assertFalse(out.exists())


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

    def letters_allowed(self, sampler, letter_ids: list[int]) -> list[bool]:
        """Which of the 26 letter tokens `sampler` allows next, in one call."""
        lib = self.llama_cpp
        data = (lib.llama_token_data * 26)(*(lib.llama_token_data(t, 0.0, 0.0) for t in letter_ids))
        candidates = lib.llama_token_data_array(data, 26, -1, False)
        lib.llama_sampler_apply(sampler, ctypes.byref(candidates))
        return [not math.isinf(data[i].logit) for i in range(26)]

    def test_llama_cpp_allows_exactly_the_board_grammars_letters_at_every_trie_node(self):
        """Walks the words' trie in llama.cpp's grammar sampler (a clone per node): at every prefix the letter
        tokens it allows are those that continue a word off the board; after 5 letters, the closing tag and the end."""
        lib, tokenize = self.llama_cpp, lambda text: self.llm.tokenize(text.encode(), add_bos=False, special=False)
        opening = tokenize("<guess>")
        spelled = [tokenize(f"<guess> {c}")[len(opening):] for c in LETTERS]     # [space] + letter (tiny vocab)
        sep, letter_ids = spelled[0][:-1], [s[-1] for s in spelled]
        self.assertTrue(all(s[:-1] == sep for s in spelled))
        trie, board = WordTrie(guess_list()), ("crane", "sloth")
        root = lib.llama_sampler_init_grammar(self.vocab, self.board_text.encode("utf-8"), b"root")
        self.assertTrue(root, "llama.cpp could not parse the board grammar")
        for token in opening:
            self.assertTrue(self.allowed(root, token))
            lib.llama_sampler_accept(root, token)
        nodes, words = [("", root)], 0
        while nodes:
            prefix, sampler = nodes.pop()
            if len(prefix) == 5:
                closing = tokenize("</guess>")
                for token in closing:
                    self.assertTrue(self.allowed(sampler, token), prefix)
                    lib.llama_sampler_accept(sampler, token)
                self.assertTrue(self.allowed(sampler, self.end), prefix)
                words += 1
            else:
                for token in sep:
                    self.assertTrue(self.allowed(sampler, token), prefix)
                    lib.llama_sampler_accept(sampler, token)
                expected = trie.allowed(prefix, board).tolist()
                self.assertEqual(self.letters_allowed(sampler, letter_ids), expected, prefix)
                for i in (i for i, ok in enumerate(expected) if ok):
                    child = lib.llama_sampler_clone(sampler)
                    lib.llama_sampler_accept(child, letter_ids[i])
                    nodes.append((prefix + LETTERS[i], child))
            lib.llama_sampler_free(sampler)
        self.assertEqual(words, len(guess_list()) - 2)

    def test_greedy_play_with_the_logit_bias_takes_only_reply_tokens(self):
        import numpy as np
        from llama_cpp import LlamaGrammar, LogitsProcessorList

        banned = np.array([t for t, _ in json.loads((self.dir / "words.logit_bias.json").read_text())])
        keep = sorted(set(range(self.words["vocab"])) - set(banned.tolist()))

        def canonical(input_ids, scores):
            scores[banned] = -np.inf
            return scores
        prompt = self.llm.tokenize(b"<start_of_turn>user\nNo clues yet.<end_of_turn>\n<start_of_turn>model\n",
                                   add_bos=True, special=True)
        grammar = LlamaGrammar.from_string(self.board_text, verbose=False)
        reply = []
        for token in self.llm.generate(prompt, temp=0.0, grammar=grammar,
                                       logits_processor=LogitsProcessorList([canonical])):
            reply.append(token)
            if self.llama_cpp.llama_vocab_is_eog(self.vocab, token) or len(reply) >= 64:
                break
        self.assertTrue(set(reply) <= set(keep), reply)
        spelled = self.llm.detokenize(reply[:-1]).decode("utf-8")
        word = spelled[len("<guess>"):-len("</guess>")].replace(" ", "")
        self.assertIn(word, set(guess_list()) - {"crane", "sloth"})

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

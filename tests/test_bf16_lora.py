"""LoRA weights and optimizer state stay float32 over a bfloat16 or 4-bit base, in GRPO and in SFT.

A bfloat16 weight has 8 bits of mantissa, so an update smaller than 1/256 of the weight rounds away: GRPO
used to cast its LoRA weights to the base's bfloat16 after loading the SFT adapter, and 3 AdamW steps at
learning rate 5e-6 changed only 9% of them. These tests load a bfloat16 base (and a 4-bit one made by
mlx-lm's converter) with an adapter, check every LoRA weight and optimizer-state array is float32 after
loading and after 3 steps at that learning rate, and that over 90% of the LoRA weights moved; and that a
float32 start adapter loads bit for bit over a bfloat16 and a 4-bit base (the model is cast before the
adapter goes in).
"""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from wordle_mlx.config import validate_config
from wordle_mlx.llm.model import lora
from wordle_mlx.llm.training.rl import LossSettings
from wordle_mlx.llm.training.rl import UpdateSettings, policy_update
from wordle_mlx.llm.training.policy import load_policy, start_adapter
from wordle_mlx.llm.training.trainer import make_optimizer
from wordle_mlx.llm.play.prompts import PromptConfig
from wordle_mlx.stages import data, grpo, sft

from tests.dtype_models import sampled_items, tiny_model_in, write_adapter

TINY = "builtin:tiny-random"
LEARNING_RATE = 5e-6


def non_float32(tree) -> list[str]:
    return [f"{k}: {v.dtype}" for k, v in tree_flatten(tree) if mx.issubdtype(v.dtype, mx.floating)
            and v.dtype != mx.float32]


def changed_fraction(before: dict, after: dict) -> float:
    moved = sum(int(np.sum(np.array(after[k]) != np.array(before[k].astype(mx.float32)))) for k in before)
    return moved / sum(v.size for v in before.values())


class StartAdapterBitExactTest(unittest.TestCase):
    def test_a_float32_start_adapter_loads_bit_for_bit_over_bf16_and_4bit(self):
        """Every stage that plays or trains from an adapter (GRPO, eval, play, self-play: `load_model`) gets the
        file's float32 LoRA weights unchanged, over a bfloat16 and a 4-bit base."""
        with tempfile.TemporaryDirectory() as tmp:
            for kind in ("bfloat16", "4bit", "bfloat16-multimodal", "4bit-multimodal"):
                with self.subTest(base=kind):
                    folder = Path(tmp) / kind
                    write_adapter(folder, tiny_model_in(kind))
                    saved = mx.load(str(folder / lora.ADAPTER_WEIGHTS))
                    self.assertEqual(non_float32(saved), [])
                    cfg = validate_config({"model": {"name": tiny_model_in(kind), "dtype": "bfloat16",
                                                     "adapter": str(folder)}}, grpo.GRPOConfig, "test")
                    model = load_policy(cfg.model, cfg.lora, cfg.run.seed, start_adapter(cfg), PromptConfig(), "grammar", False)[0]
                    loaded = lora.adapter_weights(model)
                    self.assertEqual(sorted(loaded), sorted(saved))
                    different = [k for k in saved if not np.array_equal(np.array(loaded[k]), np.array(saved[k]))]
                    self.assertEqual(different, [])


class GRPOLoraDtypeTest(unittest.TestCase):
    def test_lora_and_optimizer_state_stay_float32_and_every_weight_moves(self):
        with tempfile.TemporaryDirectory() as tmp:
            start = write_adapter(Path(tmp) / "adapter")
            for kind in ("bfloat16", "4bit"):
                with self.subTest(base=kind):
                    cfg = validate_config({"model": {"name": tiny_model_in(kind), "adapter": str(Path(tmp) / "adapter"),
                                                     "dtype": "bfloat16"},
                                           "optimizer": {"learning_rate": LEARNING_RATE}, "run": {"steps": 3}},
                                          grpo.GRPOConfig, "test")
                    model, tokenizer, _, _ = load_policy(cfg.model, cfg.lora, cfg.run.seed, start_adapter(cfg), PromptConfig(), "grammar", False)
                    self.assertEqual(model.model.norm.weight.dtype, mx.bfloat16)        # the base stays bfloat16
                    self.assertEqual(non_float32(lora.adapter_weights(model)), [])
                    optimizer, _ = make_optimizer(cfg.optimizer, cfg.run.steps)
                    optimizer.init(model.trainable_parameters())
                    self.assertEqual(non_float32(optimizer.state), [])
                    moved = []
                    for step in range(3):
                        mx.random.seed(step)
                        result = policy_update(model, optimizer, sampled_items(model, tokenizer),
                                               UpdateSettings(LossSettings()))
                        self.assertTrue(result.applied)
                        moved.append(changed_fraction(start, lora.adapter_weights(model)))
                    self.assertEqual(non_float32(lora.adapter_weights(model)), [])
                    self.assertEqual(non_float32(optimizer.state), [])
                    # AdamW moves a weight by about the lr wherever its gradient is not vanishingly small; in
                    # bfloat16 (8 bits of mantissa) such a step rounds away for most of them
                    self.assertGreater(moved[0], 0.9)
                    self.assertGreater(moved[2], 0.9)


class SFTLoraDtypeTest(unittest.TestCase):
    def test_bfloat16_sft_from_a_bfloat16_adapter_trains_float32_lora(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            data.run(validate_config({"out": str(root / "data"), "train_examples": 8, "valid_examples": 2,
                                      "think_style": "brief", "progress": False}, data.DataConfig, "test"))
            start = write_adapter(root / "adapter", dtype=mx.bfloat16)       # as a bfloat16 run might have saved it
            cfg = validate_config({"model": {"name": TINY, "dtype": "bfloat16", "adapter": str(root / "adapter")},
                                   "data": {"folder": str(root / "data"), "batch_size": 4},
                                   "run": {"logs_dir": str(root / "logs"), "name": "bf16", "steps": 3, "save_every": 1,
                                           "progress": False},
                                   "optimizer": {"learning_rate": LEARNING_RATE, "warmup_steps": 0, "min_lr_ratio": 1.0},
                                   "validation": {"every": 0}, "lora": {"rank": 4, "scale": 10.0}},
                                  sft.SFTConfig, "test")
            checkpoints = Path(sft.run(cfg)["run"]) / "checkpoints"
            moved = []
            for step in (2, 3):                    # a run keeps its two newest checkpoints
                weights = mx.load(str(checkpoints / f"step_{step:06d}" / lora.ADAPTER_WEIGHTS))
                state = mx.load(str(checkpoints / f"step_{step:06d}" / lora.OPTIMIZER_STATE))
                self.assertEqual(non_float32(weights), [])
                self.assertEqual(non_float32(state), [])
                moved.append(changed_fraction(start, weights))
            self.assertGreater(moved[0], 0.999)
            self.assertGreater(moved[1], 0.999)


if __name__ == "__main__":
    unittest.main()

"""GRPO's ratio is exactly 1 before the update, in float32, bfloat16 and 4-bit.

The rollout's log-probs come from the sampler (mlx-lm's generator, logits in the model's dtype); the trainer
recomputes log-probs with `selected_logprobs` in float32. In bfloat16 the two differed (0.016 nats on average
in the issue's rehearsal), so the ratio spread around 1 before any update. `policy_update` now takes the old
log-probs from the trainer's own forward. These tests sample real rollouts from a LoRA model in each dtype,
measure the sampler-vs-trainer gap (the ratio the old code used) and check the ratio the update uses.
"""

from __future__ import annotations

import unittest

import mlx.core as mx
from mlx.utils import tree_map

from wordle_mlx.llm.model import lora
from wordle_mlx.llm.training.grpo_loss import (LossSettings, averaging_weights, batch_arrays, grpo_loss, pack_shared_batch)
from wordle_mlx.llm.training.grpo_step import UpdateSettings, policy_update
from wordle_mlx.llm.model.models import load_model

from tests.dtype_models import sampled_items, tiny_model_in


def lora_policy(spec: str, dtype: str):
    model, tokenizer = load_model(spec, dtype=dtype)
    mx.random.seed(5)
    lora.apply_lora(model, -1, lora.lora_parameters(4, 10.0, 0.0, None))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.05, model.trainable_parameters()))
    mx.eval(model.parameters())
    return model, tokenizer


def sampler_ratio_gap(model, items) -> float:
    """max |exp(trainer log-prob - sampler log-prob) - 1| over the replies of the first group."""
    seqs = [it.sequences[0] for it in items if it.group == 0]
    batch = pack_shared_batch(seqs, [1.0] * len(seqs), averaging_weights([sum(q.mask) for q in seqs], "token"))
    _, stats = grpo_loss(model, batch_arrays(batch, rollout_logprobs=True), LossSettings())
    return stats["ratio_gap"].item()


class RatioBeforeUpdateTest(unittest.TestCase):
    def check(self, spec: str, dtype: str) -> tuple[float, float]:
        model, tokenizer = lora_policy(spec, dtype)
        mx.random.seed(0)
        items = sampled_items(model, tokenizer)
        before = sampler_ratio_gap(model, items)
        result = policy_update(model, lora_optimizer(model), items, UpdateSettings(LossSettings()))
        self.assertTrue(result.applied)
        self.assertGreater(result.trained_tokens, 0)
        self.assertLessEqual(result.ratio_gap, 1e-6)
        return before, result.ratio_gap

    def test_ratio_is_one_in_float32(self):
        self.check("builtin:tiny-random", "float32")

    def test_ratio_is_one_in_bfloat16_although_the_sampler_differs(self):
        before, _ = self.check(tiny_model_in("bfloat16"), "bfloat16")
        self.assertGreater(before, 1e-4)       # the sampler's bfloat16 log-probs are not the trainer's

    def test_ratio_is_one_in_4bit_although_the_sampler_differs(self):
        before, _ = self.check(tiny_model_in("4bit"), "bfloat16")
        self.assertGreater(before, 1e-4)


def lora_optimizer(model):
    import mlx.optimizers as optim

    optimizer = optim.AdamW(learning_rate=1e-5)
    optimizer.init(model.trainable_parameters())
    return optimizer


if __name__ == "__main__":
    unittest.main()

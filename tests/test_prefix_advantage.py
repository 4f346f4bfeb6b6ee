"""Tests for GRPO's per-token `prefix` advantages: hand-computed values, the update they make, config checks."""

from __future__ import annotations

import unittest

import numpy as np

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from wordle_mlx.config import validate_config
from wordle_mlx.errors import UserError
from wordle_mlx.llm.episode import TokenSequence
from wordle_mlx.llm.advantages import group_advantages, prefix_advantages
from wordle_mlx.llm.grpo_loss import LossSettings, batch_arrays, grpo_loss, pack_batch, pack_shared_batch
from wordle_mlx.llm.grpo_step import ScoredItem, UpdateSettings, policy_update, prefix_item_advantages
from wordle_mlx.stages import grpo as stage

from tests.test_grpo import sample_items, tiny_policy


class PrefixValues(unittest.TestCase):
    def test_hand_computed_group(self):
        # replies "c r a", "c r x", "c q z", "c r a": rewards 1, 0, 0, 1 (mean 0.5)
        replies = [[1, 2, 3], [1, 2, 4], [1, 5, 6], [1, 2, 3]]
        adv, skipped = prefix_advantages(replies, [1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0], scale=False)
        self.assertEqual(skipped, 0)
        # V("c") = 0.5 (all share it), V("c r") = 2/3, V("c r a") = 1, V("c r x") = 0, V("c q") = 0
        np.testing.assert_allclose(adv[0], [0.0, 2 / 3 - 0.5, 1 - 2 / 3])
        np.testing.assert_allclose(adv[1], [0.0, 2 / 3 - 0.5, 0 - 2 / 3])
        np.testing.assert_allclose(adv[2], [0.0, -0.5, 0.0])
        np.testing.assert_allclose(adv[3], adv[0])
        # each reply's tokens add up to GRPO's centred advantage (every distinct reply has one reward here)
        centred, _ = group_advantages([1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0], scale=False)
        np.testing.assert_allclose([a.sum() for a in adv], centred)

    def test_scaled_by_the_group_std_and_groups_are_separate(self):
        replies = [[7, 1], [7, 2], [3], [4]]
        adv, skipped = prefix_advantages(replies, [2.0, 0.0, 5.0, 5.0], [0, 0, 1, 1])
        self.assertEqual(skipped, 1)
        self.assertIsNone(adv[2])
        self.assertIsNone(adv[3])
        np.testing.assert_allclose(adv[0], [0.0, 1.0 / (1.0 + 1e-4)])
        np.testing.assert_allclose(adv[1], [0.0, -1.0 / (1.0 + 1e-4)])

    def test_bad_input_raises(self):
        with self.assertRaisesRegex(ValueError, "non-finite"):
            prefix_advantages([[1], [2]], [1.0, float("nan")], [0, 0])
        with self.assertRaisesRegex(ValueError, "2 rewards and 3 replies"):
            prefix_advantages([[1], [2], [3]], [1.0, 0.0], [0, 0])
        seq = TokenSequence([5, 6, 7], [0, 1, 1], [0.0, -1.0, -1.0])
        with self.assertRaisesRegex(ValueError, "2 model tokens but 3 token advantages"):
            pack_batch([seq], [np.zeros(3)], [np.full(2, 0.5)])
        with self.assertRaisesRegex(ValueError, "2 model tokens but 1 token advantages"):
            pack_shared_batch([seq, seq], [np.zeros(1), 0.0], [np.full(2, 0.25)] * 2)
        episode_item = ScoredItem([seq, seq], 0, 1.0, {})
        with self.assertRaisesRegex(ValueError, "one reply sequence per item"):
            prefix_item_advantages([episode_item])


class PrefixUpdate(unittest.TestCase):
    def test_update_is_the_loss_with_per_token_advantages(self):
        """One SGD step with advantage 'prefix' equals the gradient step of the GRPO loss in which every model
        token carries its own prefix advantage, and differs from plain GRPO's step."""
        model, tok = tiny_policy(13)
        prompt = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
        mx.random.seed(6)
        items = sample_items(model, tok, prompt, 2, 5, 4, lambda t: float(t[-1] % 3) + 0.01 * len(t))
        per_token = prefix_item_advantages(items)
        self.assertTrue(any(a is not None for a in per_token))
        start = [(k, mx.array(v)) for k, v in tree_flatten(model.trainable_parameters())]
        lr = 0.1
        result = policy_update(model, optim.SGD(learning_rate=lr), items,
                               UpdateSettings(LossSettings(), advantage="prefix", max_grad_norm=0.0,
                                              share_prompts=False))
        self.assertTrue(result.applied)
        moved = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}

        model.update(tree_unflatten(start))
        live = [(it.sequences[0], a) for it, a in zip(items, per_token) if a is not None]
        n_tokens = sum(sum(q.mask) for q, _ in live)
        arrays = batch_arrays(pack_batch([q for q, _ in live], [a for _, a in live],
                                         [np.full(sum(q.mask), 1.0 / n_tokens) for q, _ in live]))
        _, grads = nn.value_and_grad(model, lambda a: grpo_loss(model, a, LossSettings())[0])(arrays)
        for k, g in tree_flatten(grads):
            np.testing.assert_allclose(moved[k], np.array(dict(start)[k]) - lr * np.array(g), atol=1e-6, err_msg=k)

        model.update(tree_unflatten(start))
        policy_update(model, optim.SGD(learning_rate=lr), items,
                      UpdateSettings(LossSettings(), max_grad_norm=0.0, share_prompts=False))
        plain = {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}
        self.assertGreater(max(np.abs(plain[k] - moved[k]).max() for k in moved), 1e-6)


class PrefixConfig(unittest.TestCase):
    def test_prefix_needs_turn_mode(self):
        with self.assertRaisesRegex(UserError, "x.json.*grpo.advantage 'prefix' needs rl.mode 'turn'.*'episode'"):
            validate_config({"grpo": {"advantage": "prefix"}}, stage.GRPOConfig, "x.json")
        ok = validate_config({"grpo": {"advantage": "prefix"}, "rl": {"mode": "turn"}}, stage.GRPOConfig, "x.json")
        self.assertEqual(ok.grpo.advantage, "prefix")


if __name__ == "__main__":
    unittest.main()

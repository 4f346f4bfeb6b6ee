"""Fast play and fast updates: the lockstep letter decoder's prefill groups and batch independence (a game that ends
leaves the others' replies as they were), the update's micro-batches of several prompts (the same loss and
gradients as one micro-batch a prompt), and an update that trains only the last blocks (the same gradients for
those blocks as a full backward pass). The decoder's log-probs against the full model are in test_grammar.py."""

from __future__ import annotations

import unittest

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from wordle_mlx.game.state import GameState
from wordle_mlx.llm.model.lora import freeze_lora_below
from wordle_mlx.llm.play.episode import reply_sequence
from wordle_mlx.llm.play.generation import BatchedGenerator, SamplingConfig
from wordle_mlx.llm.play.letter_decoder import GROUP_SPREAD, _prefill_groups
from wordle_mlx.llm.play.reply_grammar import LetterChoices, LetterGrammar
from wordle_mlx.llm.play.rollout import RolloutConfig, prompt_token_ids
from wordle_mlx.llm.training.rl import LossSettings, grpo_loss
from wordle_mlx.llm.training.packing import averaging_weights, batch_arrays, merge_prompt_groups, pack_shared_batch, shared_prompt_groups

from tests import F32_RTOL
from tests.test_grammar import WORDS, lora_policy, rounding_tolerance

BOARDS = [[], ["slate"], ["brine", "stomp"], ["crane", "pious", "dumpy"], ["raise"], ["clout", "denim"]]


def board_prompts(tokenizer, secret: str = "light") -> list[list[int]]:
    cfg = RolloutConfig()
    return [prompt_token_ids(tokenizer, cfg, GameState(secret, b)) for b in BOARDS]


def flat(tree) -> dict:
    return dict(tree_flatten(tree))


class PrefillGroupsTest(unittest.TestCase):
    def test_groups_cover_the_rows_in_order_within_budget_and_spread(self):
        rng = np.random.default_rng(0)
        for budget in (64, 512, 2048):
            lengths = np.sort(rng.integers(1, 60, size=80))
            groups = _prefill_groups(lengths, budget)
            self.assertEqual([i for a, b in groups for i in range(a, b)], list(range(len(lengths))))
            for a, b in groups:
                if b - a > 1:
                    self.assertLessEqual((b - a) * lengths[b - 1], budget)
                    self.assertLessEqual(lengths[b - 1], GROUP_SPREAD * lengths[a])


class BatchIndependenceTest(unittest.TestCase):
    """Greedy replies do not depend on which other games share the batch: the letters are the same and the
    log-probs agree to float32 rounding of the logits' size."""

    def check(self, spec: str):
        model, tok = lora_policy(spec)
        prompts = board_prompts(tok)
        for mode in ("grammar", "words"):
            generate = BatchedGenerator(model, tok, mode=mode, words=WORDS)
            everyone = generate(prompts, SamplingConfig(), excluded=BOARDS)
            keep = [0, 2, 3, 5]                      # games 1 and 4 ended
            rest = generate([prompts[i] for i in keep], SamplingConfig(), excluded=[BOARDS[i] for i in keep])
            for i, reply in zip(keep, rest):
                self.assertEqual(reply.text, everyone[i].text, f"{spec} {mode} game {i}")
                scale = float(np.abs(reply.logprobs).max()) + 30.0        # the logits' size, not the log-prob's
                np.testing.assert_allclose(reply.logprobs, everyone[i].logprobs, rtol=0,
                                           atol=rounding_tolerance(1e-5, scale), err_msg=f"{spec} {mode} game {i}")

    def test_tiny_model(self):                       # a character tokenizer: a forced separator before each letter
        self.check("builtin:tiny-random")

    def test_gemma_270m(self):
        self.check("builtin:gemma-3-270m")


class MultiPromptUpdateTest(unittest.TestCase):
    def test_several_prompts_in_one_micro_batch_give_the_same_loss_and_gradients(self):
        """Replies to 4 boards packed in one micro-batch (the prompts run together, each reply attends to its own)
        against one micro-batch a board: the same loss, and the same gradient to float32 rounding."""
        model, tok = lora_policy("builtin:gemma-3-270m")
        prompts = board_prompts(tok)[:4]
        rows = [i for i in range(4) for _ in range(3)]
        replies = BatchedGenerator(model, tok, mode="grammar")([prompts[i] for i in rows],
                                                               SamplingConfig(temperature=1.0, seed=1))
        seqs = [reply_sequence(prompts[i], c.tokens, c.logprobs, c.choice) for i, c in zip(rows, replies)]
        letters = LetterChoices(LetterGrammar.for_tokenizer(tok))
        weights = averaging_weights([sum(q.mask) for q in seqs])
        adv = [float(a) for a in np.random.default_rng(0).normal(size=len(seqs))]
        model.train()
        value_and_grad = nn.value_and_grad(model, lambda a: grpo_loss(model, a, LossSettings(letters=letters))[0])
        groups, rest = shared_prompt_groups(seqs, 256)
        self.assertEqual((len(groups), rest), (4, []))
        merged = merge_prompt_groups(groups, seqs, max_tokens=4096, max_loss_tokens=256)
        self.assertEqual(merged, [list(range(12))])
        together = batch_arrays(pack_shared_batch(seqs, adv, weights), letters)
        self.assertIsInstance(together["prefix"], tuple)
        loss, grads = value_and_grad(together)
        total, summed = 0.0, None
        for idx in groups:
            one = batch_arrays(pack_shared_batch([seqs[k] for k in idx], [adv[k] for k in idx],
                                                 [weights[k] for k in idx]), letters)
            part_loss, part = value_and_grad(one)
            total += part_loss.item()
            part = flat(part)
            summed = part if summed is None else {k: summed[k] + part[k] for k in part}
        model.eval()
        scale = sum(abs(a) for a in adv) / len(adv)
        self.assertLessEqual(abs(loss.item() - total), 10 * F32_RTOL * scale)
        for k, g in flat(grads).items():
            size = float(mx.abs(summed[k]).max())
            self.assertLessEqual(float(mx.abs(g - summed[k]).max()), 1e-4 * size + 1e-12, k)

    def test_micro_batches_respect_the_token_limits(self):
        model, tok = lora_policy("builtin:gemma-3-270m")
        prompts = board_prompts(tok)
        seqs = [reply_sequence(p, p[-3:] + [10, 11, 12, 13, 14], [0.0] * 8, [0, 0, 0, 1, 1, 1, 1, 1])
                for p in prompts for _ in range(4)]
        groups, _ = shared_prompt_groups(seqs, 256)
        for max_loss in (20, 45, 1000):
            merged = merge_prompt_groups(groups, seqs, max_tokens=4096, max_loss_tokens=max_loss)
            self.assertEqual(sorted(i for m in merged for i in m), list(range(len(seqs))))
            for m in merged:
                if len(m) > 4:                       # more than one prompt's group
                    self.assertLessEqual(sum(sum(seqs[i].mask) for i in m), max_loss)


class LastBlocksGradientTest(unittest.TestCase):
    def test_training_the_last_blocks_gives_them_the_full_backward_gradients(self):
        """With the LoRA of every block but the last 2 frozen, the update's gradient (whose backward pass stops at
        the first block that trains) holds only those 2 blocks, equal to theirs in a full backward pass."""
        model, tok = lora_policy("builtin:tiny-random")
        prompts = board_prompts(tok)[:2]
        replies = BatchedGenerator(model, tok)([p for p in prompts for _ in range(2)],
                                               SamplingConfig(temperature=1.0, seed=2, max_tokens_per_turn=6))
        seqs = [reply_sequence(p, c.tokens, c.logprobs) for p, c in zip([p for p in prompts for _ in range(2)],
                                                                         replies)]
        batch = batch_arrays(pack_shared_batch(seqs, [1.0, -1.0, 0.5, -0.5],
                                               averaging_weights([sum(q.mask) for q in seqs])))
        value_and_grad = nn.value_and_grad(model, lambda a: grpo_loss(model, a, LossSettings())[0])
        model.train()
        _, full = value_and_grad(batch)
        blocks = len(model.layers)
        freeze_lora_below(model, 2)
        _, last = value_and_grad(batch)
        model.eval()
        full, last = flat(full), flat(last)
        trained = {f"layers.{i}." for i in range(blocks - 2, blocks)}
        self.assertTrue(last)
        for k, g in last.items():
            self.assertTrue(any(t in k for t in trained), f"{k} should be frozen")
            self.assertTrue(mx.array_equal(g, full[k]).item() or
                            float(mx.abs(g - full[k]).max()) <= F32_RTOL * float(mx.abs(full[k]).max()), k)
        self.assertEqual(len(last), sum(1 for k in full if any(t in k for t in trained)))


if __name__ == "__main__":
    unittest.main()

"""Guided GRPO groups (`rl.guide: "choice"`): the added reply is the model's best fitting answer on tight boards."""

from __future__ import annotations

import unittest

import numpy as np

from tests.test_choice import PROMPT, full_forward_logprob
from tests.test_greedy_return import Scripted
from tests.test_rollout import tiny
from wordle_mlx.game.feedback import feedback
from wordle_mlx.game.knowledge import candidates
from wordle_mlx.game.rewards import RewardWeights, Rewards
from wordle_mlx.game.state import GameState
from wordle_mlx.game.words import answers, guess_list
from wordle_mlx.llm import grpo_step
from wordle_mlx.llm.candidate_scores import reply_logprobs, reply_token_logprobs
from wordle_mlx.llm.generation import end_token_ids
from wordle_mlx.llm.guide import GuideReplies
from wordle_mlx.llm.prompts import parse_reply
from wordle_mlx.llm.rollout import GameSpec, RolloutConfig, prompt_messages, prompt_token_ids
from wordle_mlx.stages.grpo_config import RLSection

ALLOWED = frozenset(guess_list())


def board(secret: str, guesses: list[str]) -> GameState:
    state = GameState(secret=secret)
    for g in guesses:
        state.play(g)
    return state


class GuideTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model, cls.tok = tiny()
        cls.cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=16, prompt=PROMPT)

    def test_token_logprobs_are_the_model_s_and_sum_to_the_sequence_scores(self):
        state = board("crane", ["slate"])
        prompt = prompt_token_ids(self.tok, self.cfg, state)
        guide = GuideReplies(self.model, self.tok, self.cfg, 8)
        messages = prompt_messages(self.cfg, state)
        replies = [guide.reply_ids(messages, prompt, w) for w in ("crane", "brine", "aa")]
        per_token = reply_token_logprobs(self.model, prompt, replies, chunk=2)
        self.assertEqual([len(t) for t in per_token], [len(r) for r in replies])
        np.testing.assert_allclose([t.sum() for t in per_token], reply_logprobs(self.model, prompt, replies), atol=1e-4)
        for r, t in zip(replies, per_token):
            self.assertAlmostEqual(float(t.sum()), full_forward_logprob(self.model, prompt, r), places=3)
        hot = reply_token_logprobs(self.model, prompt, replies, temperature=2.0)
        self.assertFalse(np.allclose(hot[0], per_token[0]))    # log-probs at the sampling temperature

    def test_the_guided_reply_is_the_best_fitting_answer_on_tight_boards_only(self):
        guide = GuideReplies(self.model, self.tok, self.cfg, 8)
        self.assertIsNone(guide(GameState(secret="crane"), prompt_token_ids(self.tok, self.cfg, GameState("crane"))))
        state = board("crane", ["slate", "prick"])
        fitting = candidates(answers(), state.history())
        self.assertTrue(1 < len(fitting) <= 8, fitting)
        self.assertIn("crane", fitting)
        prompt = prompt_token_ids(self.tok, self.cfg, state)
        c = guide(state, prompt)
        word = parse_reply(c.text, False, ALLOWED).guess
        self.assertIn(word, fitting)
        self.assertIn(c.tokens[-1], end_token_ids(self.tok))
        self.assertEqual(sum(t in end_token_ids(self.tok) for t in c.tokens), 1)
        self.assertAlmostEqual(sum(c.logprobs), full_forward_logprob(self.model, prompt, c.tokens), places=3)
        messages = prompt_messages(self.cfg, state)
        scores = reply_logprobs(self.model, prompt, [guide.reply_ids(messages, prompt, w) for w in fitting])
        self.assertEqual(word, fitting[int(scores.argmax())])
        self.assertEqual(guide.guided, 1)
        self.assertIsNone(GuideReplies(self.model, self.tok, self.cfg, len(fitting) - 1)(state, prompt))

    def test_guided_replies_join_their_groups_and_are_never_played(self):
        """Secret CRANE, G = 2, the game goes on with the greedy reply: SLATE, then PRICK, then CRANE. The empty
        board and the board after SLATE have more than 8 fitting answers (no guided reply); after PRICK the
        group gets a third member, the best fitting answer, scored by the same reward."""
        self.assertGreater(len(candidates(answers(), [("slate", feedback("slate", "crane"))])), 8)
        rewards = Rewards(RewardWeights(early=1.2, valid=0.3, length=0.0), answers(), mode="turn")
        backend = Scripted(self.tok, [["xqzzy", "plonk"], ["slate"], ["abbey", "xqzzy"], ["prick"],
                                      ["xqzzy", "xqzzy"], ["crane"]])
        guide = GuideReplies(self.model, self.tok, self.cfg, 8)
        out = grpo_step.rollout_turn_mode(self.model, self.tok, [GameSpec("crane")], 2, self.cfg, ALLOWED, rewards,
                                          backend, continue_with="greedy", guide=guide)
        self.assertEqual(backend.calls, [])
        self.assertEqual([it.group for it in out.items], [0, 0, 1, 1, 2, 2, 2])
        self.assertEqual(out.episodes[0].state.guesses, ["slate", "prick", "crane"])
        guided = out.items[-1]
        word = self.tok.decode(guided.sequences[0].tokens[guided.sequences[0].mask.index(1):])
        tight = candidates(answers(), board("crane", ["slate", "prick"]).history())
        self.assertIn(parse_reply(word, False, ALLOWED).guess, tight)
        self.assertEqual(guided.values["consistent"], 1.0)
        self.assertAlmostEqual(guided.reward, rewards.total(guided.values))
        self.assertEqual(guide.guided, 1)

    def test_guide_needs_turn_mode(self):
        with self.assertRaisesRegex(ValueError, "guide 'choice' needs mode 'turn'"):
            RLSection(mode="episode", guide="choice")
        self.assertEqual(RLSection(mode="turn", guide="choice").guide_max_candidates, 32)


if __name__ == "__main__":
    unittest.main()

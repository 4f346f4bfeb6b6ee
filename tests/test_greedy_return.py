"""GRPO turn mode with `turn_reward="greedy_return"`: each reply is scored by the game greedy play makes of it."""

from __future__ import annotations

import unittest

from wordle_mlx.config import validate_config
from wordle_mlx.errors import UserError
from wordle_mlx.game.rewards import RewardWeights, Rewards
from wordle_mlx.game.words import answers, guess_list
from wordle_mlx.llm import grpo_step
from wordle_mlx.llm.generation import Completion
from wordle_mlx.llm.models import load_model
from wordle_mlx.llm.prompts import PromptConfig
from wordle_mlx.llm.rollout import GameSpec, RolloutConfig
from wordle_mlx.stages.grpo_config import GRPOConfig

ALLOWED = frozenset(guess_list())


class Scripted:
    """A backend that answers each call with fixed guesses and records (batch size, temperature) per call."""

    def __init__(self, tokenizer, calls: list[list[str]]):
        self.tokenizer, self.calls, self.seen = tokenizer, list(calls), []

    def __call__(self, prompts, cfg):
        self.seen.append((len(prompts), cfg.temperature))
        words = self.calls.pop(0)
        assert len(words) == len(prompts), (words, len(prompts))
        out = []
        for w in words:
            text = f"<guess>{w}</guess>"
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Completion(ids, [-0.5] * len(ids), text, "stop"))
        return out


class GreedyReturn(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model, cls.tok = load_model("builtin:tiny-random")
        cls.cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=16, prompt=PromptConfig(require_think=False))
        cls.rewards = Rewards(RewardWeights(early=1.2, valid=0.3, length=0.0), answers(), mode="turn")

    def test_each_reply_is_scored_by_the_game_greedy_play_makes_of_it(self):
        """Secret CRANE, G = 3. Turn 1 samples SLATE, SLATE, XQZZY (not a word); greedy says CRANE and wins.
        Played on greedily: after SLATE the player says CRANE (won in 2); after XQZZY it says PLONK, ABBEY,
        CRANE (won in 3). The two SLATE samples share one continuation."""
        backend = Scripted(self.tok, [["slate", "slate", "xqzzy"], ["crane"],     # turn 1: samples, then greedy
                                      ["crane", "plonk"], ["abbey"], ["crane"]])  # the two continuations
        out = grpo_step.rollout_turn_mode(None, self.tok, [GameSpec("crane")], 3, self.cfg, ALLOWED, self.rewards,
                                          backend, continue_with="greedy", turn_reward="greedy_return")
        self.assertEqual(backend.calls, [])
        self.assertEqual(backend.seen[2:], [(2, 0.0), (1, 0.0), (1, 0.0)])   # continuations decode greedily
        self.assertTrue(out.episodes[0].won)
        self.assertEqual(len(out.episodes[0].turns), 1)
        wins = [it.values["win"] for it in out.items]
        early = [it.values["early"] for it in out.items]
        self.assertEqual(wins, [1.0, 1.0, 1.0])
        self.assertEqual(early, [0.8, 0.8, 0.6])               # (6 - guesses) / 5
        self.assertEqual([it.values["valid"] for it in out.items], [1.0, 1.0, 0.0])   # still the reply's own
        for it in out.items:
            self.assertAlmostEqual(it.reward, self.rewards.total(it.values))
        immediate = grpo_step.rollout_turn_mode(None, self.tok, [GameSpec("crane")], 3, self.cfg, ALLOWED,
                                                self.rewards, Scripted(self.tok, [["slate", "slate", "xqzzy"],
                                                                                  ["crane"]]),
                                                continue_with="greedy")
        self.assertEqual([it.values["win"] for it in immediate.items], [0.0, 0.0, 0.0])
        self.assertGreater(out.tokens_generated, immediate.tokens_generated)

    def test_strict_returns_charge_a_guess_for_each_rejected_reply(self):
        """greedy_return_strict, the first test's games: XQZZY's game is PLONK, ABBEY, CRANE after one rejected
        reply, so it is won with 4 guesses used (early 0.4, not 0.6); SLATE's game has no rejected reply (0.8)."""
        backend = Scripted(self.tok, [["slate", "slate", "xqzzy"], ["crane"],
                                      ["crane", "plonk"], ["abbey"], ["crane"]])
        out = grpo_step.rollout_turn_mode(None, self.tok, [GameSpec("crane")], 3, self.cfg, ALLOWED, self.rewards,
                                          backend, continue_with="greedy", turn_reward="greedy_return_strict")
        self.assertEqual(backend.calls, [])
        self.assertEqual([it.values["win"] for it in out.items], [1.0, 1.0, 1.0])
        self.assertEqual([it.values["early"] for it in out.items], [0.8, 0.8, 0.4])
        self.assertTrue(out.episodes[0].won)                  # the main game keeps the game's own rules

    def test_a_forfeit_and_a_lost_game_score_nothing_and_the_greedy_member_gets_its_return(self):
        """Secret CRANE, SLATE already on the board, G = 2, train_greedy. Turn 2 samples BOIND (not a word) and
        CRANE (wins now); greedy says PLONK, and all three say CRANE at turn 3. Played on greedily, BOIND is
        followed by two more non-words (a forfeit after 3 invalid replies) and PLONK by ABBEY, FLUFF, GIMPY,
        HOARD (six guesses, lost). A reply that ends the game needs no continuation."""
        backend = Scripted(self.tok, [["boind", "crane"], ["plonk"], ["crane", "crane"], ["crane"],
                                      ["boinx", "abbey"], ["boinx", "fluff"], ["gimpy"], ["hoard"]])
        out = grpo_step.rollout_turn_mode(None, self.tok, [GameSpec("crane", ["slate"])], 2, self.cfg, ALLOWED,
                                          self.rewards, backend, continue_with="greedy", train_greedy=True,
                                          turn_reward="greedy_return")
        self.assertEqual(backend.calls, [])
        self.assertEqual(backend.seen[4:], [(2, 0.0), (2, 0.0), (1, 0.0), (1, 0.0)])
        self.assertEqual([it.group for it in out.items], [0, 0, 0, 1, 1, 1])
        self.assertEqual([it.values["win"] for it in out.items], [0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
        self.assertEqual([it.values["early"] for it in out.items], [0.0, 0.8, 0.0, 0.6, 0.6, 0.6])
        self.assertEqual([it.values["valid"] for it in out.items], [0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
        self.assertEqual(len(out.episodes[0].turns), 2)          # the main game: PLONK, then CRANE

    def test_the_config_needs_turn_mode(self):
        base = {"rl": {"mode": "episode", "turn_reward": "greedy_return"}}
        with self.assertRaises(UserError) as err:
            validate_config(base, GRPOConfig, "cfg.json")
        self.assertIn("turn_reward", str(err.exception))
        with self.assertRaises(ValueError):
            grpo_step.rollout_turn_mode(None, self.tok, [GameSpec("crane")], 2, self.cfg, ALLOWED, self.rewards,
                                        Scripted(self.tok, []), turn_reward="rollout")


if __name__ == "__main__":
    unittest.main()

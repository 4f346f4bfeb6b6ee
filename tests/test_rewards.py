"""Tests for game/rewards.py: component values, the reward invariants (property tests), and misconfiguration."""

from __future__ import annotations

import math
import unittest

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from wordle_mlx.game.feedback import feedback
from wordle_mlx.game.knowledge import candidates
from wordle_mlx.game.rewards import ReplyKind, RewardWeights, Rewards, TurnFacts
from wordle_mlx.game.words import answers, guess_list
from wordle_mlx.config import validate_config
from wordle_mlx.errors import UserError
from wordle_mlx.stages.grpo_config import GRPOConfig

ANSWERS = answers()
GUESSES = guess_list()
REWARDS = Rewards(RewardWeights(), ANSWERS)


def board(secret: str, guesses: list[str]) -> tuple:
    return tuple((g, feedback(g, secret)) for g in guesses)


def facts(secret, guesses, kind, guess=None, tokens=10, max_tokens=100):
    return TurnFacts(secret, board(secret, guesses), kind, guess, tokens, max_tokens)


# weights that pass the checks, drawn around the defaults (draws the checks refuse are discarded)
@st.composite
def weights_strategy(draw):
    f, v, c, i, r, l = (draw(st.floats(0.01, 0.3)) for _ in range(6))
    try:
        return RewardWeights(win=1.0, early=5 * (2 * f + v + c + i + l) + 0.01, format=f, valid=v, consistent=c,
                             info_gain=i, repeat=max(r, l), length=min(l, v))
    except ValueError:
        assume(False)


history_strategy = st.tuples(st.sampled_from(ANSWERS), st.lists(st.sampled_from(GUESSES[:3000]), max_size=4))


class ComponentValues(unittest.TestCase):
    def test_valid_consistent_new_word(self):
        secret, guesses = "crane", ["slate"]
        hist = board(secret, guesses)
        cands = candidates(ANSWERS, hist)
        self.assertIn("crane", cands)
        v = REWARDS.turn_values(facts(secret, guesses, ReplyKind.VALID, "crane"))
        self.assertEqual((v["format"], v["valid"], v["consistent"], v["repeat"]), (1.0, 1.0, 1.0, 0.0))
        self.assertTrue(0.0 < v["info_gain"] <= 1.0)
        self.assertAlmostEqual(v["length"], -0.1)

    def test_info_gain_is_normalised_entropy(self):
        v = REWARDS.turn_values(facts("crane", [], ReplyKind.VALID, "soare"))
        # soare splits the 2,315 answers into ~5.89 bits out of log2(2315) ~ 11.18
        self.assertAlmostEqual(v["info_gain"] * math.log2(len(ANSWERS)), 5.88596, places=4)

    def test_repeated_word(self):
        v = REWARDS.turn_values(facts("crane", ["slate", "pious"], ReplyKind.VALID, "slate"))
        self.assertEqual((v["repeat"], v["info_gain"], v["consistent"], v["valid"]), (-1.0, 0.0, 0.0, 1.0))

    def test_format_error_and_not_a_word(self):
        fe = REWARDS.turn_values(facts("crane", [], ReplyKind.FORMAT_ERROR))
        nw = REWARDS.turn_values(facts("crane", [], ReplyKind.NOT_A_WORD))
        self.assertEqual((fe["format"], fe["valid"], fe["info_gain"]), (-1.0, 0.0, 0.0))
        self.assertEqual((nw["format"], nw["valid"], nw["info_gain"]), (1.0, 0.0, 0.0))

    def test_turn_mode_win_and_early(self):
        v = REWARDS.turn_mode_values(facts("crane", ["slate"], ReplyKind.VALID, "crane"))
        self.assertEqual(v["win"], 1.0)
        self.assertAlmostEqual(v["early"], (6 - 2) / 5)
        lose = REWARDS.turn_mode_values(facts("crane", ["slate"], ReplyKind.VALID, "crate"))
        self.assertEqual((lose["win"], lose["early"]), (0.0, 0.0))

class Invariants(unittest.TestCase):
    @settings(max_examples=60, deadline=None)
    @given(weights_strategy(), history_strategy, st.sampled_from(GUESSES[:3000]), st.integers(0, 100), st.integers(0, 100))
    def test_format_failure_is_worst(self, w, hist, guess, tok_a, tok_b):
        secret, guesses = hist
        if secret in guesses:
            return
        r = Rewards(w, ANSWERS)
        bad = r.total(r.turn_mode_values(facts(secret, guesses, ReplyKind.FORMAT_ERROR, None, tok_a)))
        for kind, g in ((ReplyKind.VALID, guess), (ReplyKind.NOT_A_WORD, None),
                        (ReplyKind.VALID, guesses[0] if guesses else guess)):
            other = r.total(r.turn_mode_values(facts(secret, guesses, kind, g, tok_b)))
            self.assertLess(bad, other, (kind, g))

    @settings(max_examples=60, deadline=None)
    @given(weights_strategy(), history_strategy, st.sampled_from(GUESSES[:3000]), st.integers(0, 100), st.integers(0, 100))
    def test_invalid_or_repeated_never_above_valid_new(self, w, hist, guess, tok_a, tok_b):
        secret, guesses = hist
        if secret in guesses or guess in guesses:
            return
        r = Rewards(w, ANSWERS)
        new = r.total(r.turn_values(facts(secret, guesses, ReplyKind.VALID, guess, tok_b)))
        invalid = r.total(r.turn_values(facts(secret, guesses, ReplyKind.NOT_A_WORD, None, tok_a)))
        self.assertLessEqual(invalid, new + 1e-12)
        if guesses:
            repeated = r.total(r.turn_values(facts(secret, guesses, ReplyKind.VALID, guesses[-1], tok_a)))
            self.assertLessEqual(repeated, new + 1e-12)

# weights for a group of replies to one board: early may be anything >= 0, only win > info_gain + length is asked
# (built to pass the checks, so nothing is filtered: length <= format, valid; length <= repeat < valid + format)
@st.composite
def turn_weights_strategy(draw):
    f, v, c, i = (draw(st.floats(0.01, 1.0)) for _ in range(4))
    length = draw(st.floats(0.0, 0.99)) * min(f, v)
    repeat = length + draw(st.floats(0.0, 0.99)) * (v + f - length)
    w = RewardWeights(win=i + length + draw(st.floats(0.01, 2.0)), early=draw(st.floats(0.0, 2.0)), format=f,
                      valid=v, consistent=c, info_gain=i, repeat=repeat, length=length)
    w.check()
    return w


class GroupInvariant(unittest.TestCase):
    """A GRPO group is the replies to one board: a winning reply must outscore every other one."""

    @settings(max_examples=80, deadline=None)
    @given(turn_weights_strategy(), history_strategy, st.sampled_from(GUESSES[:3000]), st.integers(0, 100),
           st.integers(0, 100))
    def test_winning_reply_beats_every_other_reply_to_the_board(self, w, hist, guess, tok_a, tok_b):
        secret, guesses = hist
        if secret in guesses or guess == secret:
            return
        r = Rewards(w, ANSWERS)
        win = r.total(r.turn_mode_values(facts(secret, guesses, ReplyKind.VALID, secret, tok_a, 100)))
        for kind, g in ((ReplyKind.VALID, guess), (ReplyKind.NOT_A_WORD, None), (ReplyKind.FORMAT_ERROR, None)):
            other = r.total(r.turn_mode_values(facts(secret, guesses, kind, g, tok_b, 100)))
            self.assertGreater(win, other, (kind, g))

    def test_win_must_beat_info_gain(self):
        with self.assertRaisesRegex(ValueError, r"win \(0.1\) must be > info_gain \+ length"):
            RewardWeights(win=0.1, early=5.0, info_gain=0.2).check()
        RewardWeights(early=0.1, valid=1.0, repeat=1.0).check()          # a small early is fine

    def test_grpo_config_checks_the_reward(self):
        small_early = {"early": 0.2, "valid": 1.0, "repeat": 1.0}
        cfg = validate_config({"reward": small_early}, GRPOConfig, "x.json")
        self.assertEqual(cfg.reward.early, 0.2)
        self.assertEqual(cfg.reward.weights().win, 1.0)
        with self.assertRaisesRegex(UserError, r"^x.json: reward: reward weight win \(1.0\) must be > info_gain"):
            validate_config({"reward": {"info_gain": 1.5}}, GRPOConfig, "x.json")


class Misconfiguration(unittest.TestCase):
    def test_negative_nan_unknown(self):
        with self.assertRaisesRegex(ValueError, "repeat must be >= 0"):
            RewardWeights(repeat=-0.1)
        with self.assertRaisesRegex(ValueError, "finite"):
            RewardWeights(info_gain=float("nan"))
        with self.assertRaisesRegex(ValueError, "unknown reward component 'speed'"):
            RewardWeights.from_dict({"speed": 1.0})

    def test_weights_that_break_invariants(self):
        with self.assertRaisesRegex(ValueError, "format must be > 0"):
            RewardWeights(format=0.0)
        with self.assertRaisesRegex(ValueError, "win must be > 0"):
            RewardWeights(win=0.0)
        with self.assertRaisesRegex(ValueError, "format error"):
            RewardWeights(format=0.01, repeat=0.5, early=5.0)
        with self.assertRaisesRegex(ValueError, "length"):
            RewardWeights(length=0.04, early=2.0)

    def test_failures_raise_not_zero(self):
        with self.assertRaisesRegex(ValueError, "5-letter guess"):
            REWARDS.turn_values(facts("crane", [], ReplyKind.VALID, None))
        with self.assertRaisesRegex(ValueError, "not finite"):
            REWARDS.total({"win": float("nan")})
        with self.assertRaisesRegex(ValueError, "unknown reward component"):
            REWARDS.total({"bonus": 1.0})
        with self.assertRaisesRegex(ValueError, "1..6 guesses"):
            REWARDS.early_value(True, 7)
        with self.assertRaisesRegex(ValueError, "already over"):
            REWARDS.turn_values(facts("crane", ["slate", "pious", "dumpy", "fight", "block", "wreck"],
                                      ReplyKind.NOT_A_WORD))

    def test_stage_config_rejects_bad_reward(self):
        with self.assertRaisesRegex(UserError, r"^cfg.json: reward.repeat: Input should be greater than or equal to 0"):
            validate_config({"reward": {"repeat": -1}}, GRPOConfig, "cfg.json")
        with self.assertRaisesRegex(UserError, r"cfg.json: reward.bonus: unknown field"):
            validate_config({"reward": {"bonus": 1}}, GRPOConfig, "cfg.json")


if __name__ == "__main__":
    unittest.main()

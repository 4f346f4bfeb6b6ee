"""GRPO step metrics (`llm/training/step_metrics.py`): counts from several ranks combine to the rates of all their games."""

import unittest

from wordle_mlx.game.state import GameState
from wordle_mlx.llm.play.episode import Episode, Turn
from wordle_mlx.llm.play.prompts import MISSING_GUESS, NOT_A_WORD
from wordle_mlx.llm.play.games import game_counts, rates_from_counts
from wordle_mlx.llm.training.step_metrics import value_stats


def turn(guess, error=None, repeated=False):
    return Turn([1], [2], [0.0], guess or "", guess, error, repeated=repeated)


def episode(secret, played, extra_turns=()):
    state = GameState.from_history(secret, list(played))
    turns = [turn(g, repeated=(g in played[:i])) for i, g in enumerate(played)] + list(extra_turns)
    return Episode(secret, [], state, turns)


class StepMetricsTest(unittest.TestCase):
    def setUp(self):
        self.won_in_2 = episode("crane", ["slate", "crane"])
        # three guesses played (the second a repeat), then a non-word and a reply with no guess tag; not won
        self.three_played = episode("crane", ["slate", "slate", "moist"],
                                    [turn("xxxxx", NOT_A_WORD), turn(None, MISSING_GUESS)])
        self.won_in_1 = episode("crane", ["crane"])

    def test_rates_of_one_batch(self):
        games = [self.won_in_2, self.three_played, self.won_in_1]
        replies = [t for ep in games for t in ep.turns]
        rates = rates_from_counts([game_counts(games, replies)])
        self.assertAlmostEqual(rates["win_rate"], 2 / 3)
        self.assertAlmostEqual(rates["mean_guesses"], 1.5)
        self.assertAlmostEqual(rates["invalid_rate"], 1 / 8)          # 8 replies, one well-formed non-word
        self.assertAlmostEqual(rates["format_error_rate"], 1 / 8)     # and one without a guess tag
        self.assertAlmostEqual(rates["repeat_rate"], 1 / 6)           # 6 played guesses, one repeat

    def test_counts_from_two_ranks_give_the_rates_of_all_games(self):
        a, b = [self.won_in_2, self.three_played], [self.won_in_1]
        parts = [game_counts(g, [t for ep in g for t in ep.turns]) for g in (a, b)]
        whole = game_counts(a + b, [t for ep in a + b for t in ep.turns])
        self.assertEqual(rates_from_counts(parts), rates_from_counts([whole]))

    def test_no_games_and_no_wins(self):
        rates = rates_from_counts([game_counts([], [])])
        self.assertEqual((rates["win_rate"], rates["mean_guesses"], rates["repeat_rate"]), (0.0, None, 0.0))

    def test_value_stats_mean_and_std_per_component(self):
        stats = value_stats([{"win": 1.0, "valid": 1.0}, {"win": 0.0}])
        self.assertEqual(stats["win"], {"mean": 0.5, "std": 0.5})
        self.assertEqual(stats["valid"], {"mean": 0.5, "std": 0.5})   # a missing component counts as 0
        self.assertEqual(stats["early"], {"mean": 0.0, "std": 0.0})


if __name__ == "__main__":
    unittest.main()

"""The whole-game comparison of `make llamacpp-check` (scripts/llamacpp_games.py), without llama.cpp.

`margins` must read wordle-mlx's own choice back from its recorded game: at a letter where the two sides differ,
its argmax over the letters its decoding allows is its own letter, its top-2 margin is positive, its margin over
another allowed letter is at least the top-2 margin, and a letter its words decoding rules out has no margin.
`near_ties` must count a game as a near-tie only when that margin is below the logit error and llama.cpp took
no other token and repeated no board word.
"""

from __future__ import annotations

import copy
import sys
import unittest
from pathlib import Path

from wordle_mlx.game.words import guess_list
from wordle_mlx.llm.model.models import load_model
from wordle_mlx.llm.play.reply_grammar import LETTERS, LetterGrammar, WordTrie
from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig, play_games

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import llamacpp_games  # noqa: E402


def difference(gap, other_tokens=(), repeats=False) -> dict:
    return {"margins": {"token": 3, "top2_margin": gap, "gap_to_llama_cpp": gap},
            "llama_cpp_other_tokens": list(other_tokens), "llama_cpp_repeats_a_board_word": repeats}


class NearTieTest(unittest.TestCase):
    def test_only_a_margin_below_the_logit_error_with_the_decoders_tokens_is_a_near_tie(self):
        games = {"games": 10, "games_identical": 5,
                 "differing": [difference(0.01), difference(0.2), difference(None), difference(0.01, [" "]),
                               difference(0.01, repeats=True)]}
        out = llamacpp_games.near_ties(games, logit_error=0.05)
        self.assertEqual([d["near_tie"] for d in out["differing"]], [True, False, False, False, False])
        self.assertEqual((out["near_ties"], out["games_identical_or_near_tie"]), (1, 6))


class MarginsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model, cls.tokenizer = load_model("builtin:tiny-random")
        cls.allowed = frozenset(guess_list())
        cls.letters = LetterGrammar.for_tokenizer(cls.tokenizer)
        rollout = RolloutConfig(temperature=0.0, decode="words")
        episode = play_games(cls.model, cls.tokenizer, [GameSpec(secret="crane")], rollout, cls.allowed)[0]
        cls.ours = llamacpp_games.game_record(episode)

    def theirs_with(self, turn: int, position: int, letter: str) -> tuple[dict, int]:
        """Our record with the letter at `position` (0-4) of `turn`'s reply replaced; (record, token index)."""
        theirs = copy.deepcopy(self.ours)
        tokens = theirs["tokens"][turn - 1]
        index = [k for k, t in enumerate(tokens) if t in self.letters.index_of][position]
        tokens[index] = self.letters.letter_ids[LETTERS.index(letter)]
        return theirs, index

    def test_our_letter_is_the_argmax_and_another_allowed_letter_is_no_closer_than_the_runner_up(self):
        word = self.ours["played"][0]
        trie = WordTrie(self.allowed)
        other = next(c for c, ok in zip(LETTERS, trie.allowed("")) if ok and c != word[0])
        theirs, index = self.theirs_with(1, 0, other)
        m = llamacpp_games.margins(self.model, self.tokenizer, "words", self.allowed, self.ours, theirs, 1)
        self.assertEqual(m["token"], index)
        self.assertTrue(m["argmax_is_ours"])
        self.assertGreater(m["top2_margin"], 0.0)
        self.assertGreaterEqual(m["gap_to_llama_cpp"], m["top2_margin"])

    def test_a_letter_words_decoding_rules_out_has_no_margin(self):
        word = self.ours["played"][0]
        ruled_out = next(c for c, ok in zip(LETTERS, WordTrie(self.allowed).allowed(word[:4])) if not ok)
        theirs, _ = self.theirs_with(1, 4, ruled_out)
        m = llamacpp_games.margins(self.model, self.tokenizer, "words", self.allowed, self.ours, theirs, 1)
        self.assertIsNone(m["gap_to_llama_cpp"])
        self.assertTrue(m["argmax_is_ours"])


if __name__ == "__main__":
    unittest.main()

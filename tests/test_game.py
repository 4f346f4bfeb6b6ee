"""The Wordle engine: feedback rule, knowledge and candidate filter, entropy values, solver, word lists."""

from __future__ import annotations

import random
import tempfile
import unittest
from collections import Counter
from pathlib import Path

import numpy as np

from wordle_mlx.errors import UserError
from wordle_mlx.game import GameState, Knowledge, candidates, check_guess, feedback, is_consistent
from wordle_mlx.game.feedback import code_to_pattern, pattern_matrix, pattern_to_code
from wordle_mlx.game.entropy import PatternTable, entropies, entropy_of
from wordle_mlx.game.solver import Solver
from wordle_mlx.game.splits import split_answers
from wordle_mlx.game.words import allowed, answers, guess_list, load_word_list, parse_word_lines


def reference_feedback(guess: str, answer: str) -> str:
    """Independent slow reference: mark greens, then scan left to right consuming a multiset."""
    pool = Counter(a for g, a in zip(guess, answer) if g != a)
    out = []
    for g, a in zip(guess, answer):
        if g == a:
            out.append("G")
        elif pool[g] > 0:
            pool[g] -= 1
            out.append("Y")
        else:
            out.append("X")
    return "".join(out)


class FeedbackTest(unittest.TestCase):
    def test_known_cases(self):
        self.assertEqual(feedback("speed", "abide"), "XXYXY")
        self.assertEqual(feedback("kebab", "abbey"), "XYGYY")
        self.assertEqual(feedback("eeeee", "levee"), "XGXGG")
        self.assertEqual(feedback("crane", "crane"), "GGGGG")
        self.assertEqual(feedback("llama", "hello"), "YYXXX")   # two Ls in the answer: both yellow
        self.assertEqual(feedback("lolly", "hello"), "XYGGX")   # both answer Ls used by greens: first L grey
        self.assertEqual(feedback("alley", "lapel"), "YYYGX")   # two unused Ls: both Ls yellow

    def test_matches_reference_on_random_pairs(self):
        rng = random.Random(1)
        words = guess_list()
        # include words with repeated letters deliberately
        repeats = [w for w in words if len(set(w)) < 5]
        for _ in range(4000):
            g = rng.choice(repeats if rng.random() < 0.5 else words)
            a = rng.choice(repeats if rng.random() < 0.5 else words)
            self.assertEqual(feedback(g, a), reference_feedback(g, a), (g, a))

    def test_vectorised_matrix_matches_scalar(self):
        rng = random.Random(2)
        gs = rng.sample(list(guess_list()), 300) + ["eeeee", "kebab", "speed"]
        ans = rng.sample(list(answers()), 200) + ["levee", "abbey", "abide"]
        m = pattern_matrix(gs, ans, chunk=37)
        self.assertEqual(m.dtype, np.uint8)
        for i, g in enumerate(gs):
            for j, a in enumerate(ans):
                self.assertEqual(code_to_pattern(m[i, j]), reference_feedback(g, a))

    def test_code_roundtrip(self):
        for code in range(243):
            self.assertEqual(pattern_to_code(code_to_pattern(code)), code)
        self.assertEqual(pattern_to_code("GGGGG"), 242)


class StateAndKnowledgeTest(unittest.TestCase):
    def test_game_state(self):
        s = GameState("abbey")
        self.assertEqual(s.play("kebab"), "XYGYY")
        self.assertFalse(s.over)
        s.play("abbey")
        self.assertTrue(s.won and s.over and not s.lost)
        self.assertEqual(s.turn, 2)
        with self.assertRaises(ValueError):
            s.play("crane")
        lost = GameState.from_history("abbey", ["crane"] * 6)
        self.assertTrue(lost.lost and lost.over and not lost.won)

    def test_check_guess_reasons(self):
        ok = set(allowed())
        self.assertIsNone(check_guess("crane", ok))
        self.assertIn("letters", check_guess("cran", ok))
        self.assertIn("a-z", check_guess("cr4ne", ok))
        self.assertIn("not in the allowed", check_guess("zzzzz", ok))

    def test_knowledge_agrees_with_replay(self):
        rng = random.Random(3)
        words = list(answers())
        pool = list(guess_list())
        for _ in range(60):
            secret = rng.choice(words)
            history = []
            for g in rng.sample(pool, rng.randint(1, 4)):
                history.append((g, feedback(g, secret)))
            k = Knowledge.from_history(history)
            brute = [w for w in words if all(feedback(g, w) == p for g, p in history)]
            self.assertEqual([w for w in words if k.allows(w)], brute)
            self.assertEqual(candidates(words, history), brute)
            self.assertIn(secret, brute)
            for w in rng.sample(words, 20):
                self.assertEqual(is_consistent(w, history), w in brute)

    def test_knowledge_facts(self):
        k = Knowledge.from_history([("speed", feedback("speed", "abide"))])
        self.assertEqual(k.greens, {})
        self.assertEqual(k.min_count["e"], 1)
        self.assertEqual(k.max_count["e"], 1)
        self.assertIn("s", k.absent)
        self.assertEqual(k.misplaced["d"], [4])


class EntropyAndSolverTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cache = tempfile.TemporaryDirectory()
        cls.table = PatternTable.cached(guess_list(), answers(), folder=Path(cls.cache.name))
        cls.solver = Solver(cls.table)

    @classmethod
    def tearDownClass(cls):
        cls.cache.cleanup()

    def test_known_entropies(self):
        bits = self.table.entropies()
        by_word = dict(zip(self.table.guesses, bits))
        self.assertAlmostEqual(by_word["soare"], 5.8860, places=4)
        self.assertAlmostEqual(by_word["roate"], 5.8828, places=4)
        self.assertAlmostEqual(by_word["raise"], 5.8779, places=4)
        self.assertEqual(self.table.guesses[int(np.argmax(bits))], "soare")

    def test_entropy_matches_direct_count(self):
        row = self.table.matrix[self.table.guess_index["crane"]]
        counts = Counter(feedback("crane", a) for a in self.table.answers[:500])
        n = 500
        direct = -sum(c / n * np.log2(c / n) for c in counts.values())
        self.assertAlmostEqual(entropy_of(row[:500]), direct, places=9)
        self.assertAlmostEqual(float(entropies(self.table.matrix[[self.table.guess_index["crane"]]],
                                               np.arange(500))[0]), direct, places=9)

    def test_cache_is_reused_and_stale_cache_rebuilt(self):
        files = list(Path(self.cache.name).glob("patterns-*.npz"))
        self.assertEqual(len(files), 1)
        again = PatternTable.cached(guess_list(), answers(), folder=Path(self.cache.name))
        self.assertTrue(np.array_equal(again.matrix, self.table.matrix))
        files[0].write_bytes(b"not a zip file")
        rebuilt = PatternTable.cached(guess_list(), answers(), folder=Path(self.cache.name))
        self.assertTrue(np.array_equal(rebuilt.matrix, self.table.matrix))

    def test_solver_invariants(self):
        rng = random.Random(4)
        for secret in rng.sample(list(self.table.answers), 150):
            guesses = self.solver.play(secret)
            self.assertEqual(guesses[-1], secret)
            self.assertLessEqual(len(guesses), 6)
            self.assertEqual(guesses[0], "soare")
            self.assertEqual(len(set(guesses)), len(guesses))
            history = []
            for g in guesses:
                # every guess is allowed, and the candidate set only shrinks and keeps the secret
                self.assertIn(g, self.table.guess_index)
                history.append((g, feedback(g, secret)))
                self.assertIn(secret, candidates(self.table.answers, history))

    def test_solver_plays_candidate_when_two_left(self):
        cols = self.table.answer_columns(["baker", "maker"])
        self.assertIn(self.table.guesses[self.solver.best_guess_row(cols)], ("baker", "maker"))

    def test_best_candidate_is_the_first_best_splitting_candidate(self):
        """Against a direct count: each candidate's feedback entropy over the candidates (entropy_of), the first
        maximum in answer order; asked twice, the memo gives the same word."""
        for history in ([("raise", feedback("raise", "crone"))], [("slate", feedback("slate", "mound"))]):
            cols = self.solver.candidate_columns(history)
            words = [self.table.answers[c] for c in cols]
            bits = [round(entropy_of(self.table.matrix[self.table.guess_index[w]][cols]), 9) for w in words]
            want = words[int(np.argmax(bits))]
            self.assertGreater(len(words), 10)
            self.assertEqual(self.solver.best_candidate(cols), want)
            self.assertEqual(self.solver.best_candidate(cols.copy()), want)
        with self.assertRaises(ValueError):
            self.solver.best_candidate(np.array([], dtype=np.int64))

    def test_seeded_history_is_continued(self):
        guesses = self.solver.play("abbey", history=["crane"])
        self.assertEqual(guesses[0], "crane")
        self.assertEqual(guesses[-1], "abbey")


class WordListTest(unittest.TestCase):
    def test_packaged_lists(self):
        self.assertEqual(len(answers()), 2315)
        self.assertEqual(len(allowed()), 12972)
        self.assertEqual(len(load_word_list("nyt")), 14855)
        self.assertTrue(set(answers()) <= set(allowed()))

    def test_bad_line_names_file_and_line(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d, "words.txt")
            path.write_text("crane\nslate\ncr4ne\n")
            with self.assertRaises(UserError) as ctx:
                load_word_list(str(path))
            self.assertIn("words.txt:3", str(ctx.exception))
            self.assertIn("cr4ne", str(ctx.exception))
        with self.assertRaises(UserError) as ctx:
            parse_word_lines("crane\nabc\n", "x.txt")
        self.assertIn("x.txt:2", str(ctx.exception))
        with self.assertRaises(UserError):
            load_word_list("/no/such/list.txt")
        with self.assertRaises(UserError):
            parse_word_lines("\n# only a comment\n", "empty.txt")

    def test_splits_are_disjoint_and_fixed(self):
        s = split_answers()
        self.assertEqual(len(s["test"]), 200)
        self.assertEqual(len(s["valid"]), 100)
        self.assertEqual(len(s["train"]), 2315 - 300)
        self.assertFalse(set(s["test"]) & set(s["train"]))
        self.assertFalse(set(s["test"]) & set(s["valid"]))
        self.assertFalse(set(s["valid"]) & set(s["train"]))
        self.assertEqual(s, split_answers())


if __name__ == "__main__":
    unittest.main()

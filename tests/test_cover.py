"""Answer coverage (`game/coverage.py`, `wordle-mlx cover`): every answer as a fitting non-secret guess, checked data."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from wordle_mlx.config import load_config
from wordle_mlx.errors import UserError
from wordle_mlx.game.coverage import coverage_examples
from wordle_mlx.game.feedback import feedback
from wordle_mlx.game.knowledge import is_consistent
from wordle_mlx.game.solver import Solver
from wordle_mlx.game.splits import split_answers
from wordle_mlx.game.state import MAX_GUESSES
from wordle_mlx.llm.play.prompts import PromptConfig, build_messages, format_reply
from wordle_mlx.llm.training.sft_data import replay_problem
from wordle_mlx.stages import cover
from wordle_mlx.stages.pattern_table import load_table



PROMPT = PromptConfig(require_think=False, context="summary", style="compact", guess_format="letters")


def fitting(solver: Solver, secret: str, guesses) -> list[str]:
    return [solver.table.answers[c] for c in solver.candidate_columns([(g, feedback(g, secret)) for g in guesses])]


class CoverageExamplesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.solver = Solver(load_table(show_progress=False))
        train = split_answers()["train"]
        # the solver's games over some train secrets: every prefix is a board, as in an SFT data folder
        cls.boards = []
        for secret in train[:40]:
            game = cls.solver.play(secret)
            cls.boards += [(secret, tuple(game[:k])) for k in range(len(game))]

    def test_each_label_fits_its_board_is_not_the_secret_and_its_board_is_the_tightest(self):
        words = sorted({w for s, g in self.boards for w in fitting(self.solver, s, g)})[:300]
        examples, uncovered = coverage_examples(self.boards, words, self.solver)
        self.assertEqual(len(examples) + len(uncovered), len(words))
        self.assertGreater(len(examples), 200)
        for ex in examples:
            board = fitting(self.solver, ex.secret, ex.history)
            self.assertEqual(ex.candidates, len(board))
            self.assertIn(ex.word, board)
            self.assertNotEqual(ex.word, ex.secret)
            self.assertNotIn(ex.word, ex.history)
            self.assertTrue(is_consistent(ex.word, [(g, feedback(g, ex.secret)) for g in ex.history]))
            # no board of the set would have been tighter for this word
            tighter = [(s, g) for s, g in self.boards if s != ex.word and ex.word not in g
                       and ex.word in (f := fitting(self.solver, s, g)) and len(f) < ex.candidates]
            self.assertEqual(tighter, [], ex)
        for word in uncovered:          # only boards where it is the secret or already guessed
            self.assertFalse(any(s != word and word not in g and word in fitting(self.solver, s, g)
                                 for s, g in self.boards), word)

    def test_one_board_per_word_in_the_order_of_words(self):
        words = ["crane", "stone", "light"]
        examples, uncovered = coverage_examples(self.boards, words, self.solver)
        self.assertEqual(uncovered, [])        # the empty board alone fits every word
        self.assertEqual([ex.word for ex in examples], words)

    def test_max_candidates_keeps_only_tight_boards(self):
        words = sorted({w for s, g in self.boards for w in fitting(self.solver, s, g)})
        every, never = coverage_examples(self.boards, words, self.solver)
        tight, uncovered = coverage_examples(self.boards, words, self.solver, max_candidates=5)
        self.assertTrue(all(ex.candidates <= 5 for ex in tight))
        # the same picks where the tightest board was already tight enough; the rest uncovered
        self.assertEqual(tight, [ex for ex in every if ex.candidates <= 5])
        self.assertEqual(set(uncovered), {ex.word for ex in every if ex.candidates > 5} | set(never))
        with self.assertRaisesRegex(ValueError, "max_candidates must be at least 2"):
            coverage_examples(self.boards, words, self.solver, max_candidates=1)

    def test_a_word_that_is_only_ever_the_secret_is_uncovered(self):
        secret = self.boards[0][0]
        only = [(s, g) for s, g in self.boards if s == secret]
        examples, uncovered = coverage_examples(only, [secret], self.solver)
        self.assertEqual((examples, uncovered), ([], [secret]))

    def test_bad_arguments_raise(self):
        with self.assertRaisesRegex(ValueError, "'zzzzz' is not an answer word"):
            coverage_examples(self.boards, ["zzzzz"], self.solver)


class CoverRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.solver = Solver(load_table(show_progress=False))
        cls.splits = split_answers()

    def make_input(self, root: Path, prompt: PromptConfig = PROMPT, name: str = "in") -> Path:
        """A small bare-guess SFT data folder: the solver's moves on the boards of 12 train and 3 valid games."""
        folder = root / name
        folder.mkdir()
        for split, secrets in (("train", self.splits["train"][:12]), ("valid", self.splits["valid"][:3])):
            lines = []
            for secret in secrets:
                game = self.solver.play(secret)
                for k in range(len(game)):
                    history = [(g, feedback(g, secret)) for g in game[:k]]
                    messages = build_messages(prompt, history, (), MAX_GUESSES) + [
                        {"role": "assistant", "content": format_reply(None, game[k], prompt.guess_format)}]
                    lines.append(json.dumps({"messages": messages, "meta": {
                        "secret": secret, "history": game[:k], "seeded": 0, "mode": "teacher", "target": game[k]}}))
            (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        (folder / "stats.json").write_text(json.dumps({"prompt": prompt.model_dump(), "seed": 0}))
        return folder

    def test_run_adds_one_checked_example_per_answer_and_keeps_the_input(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = self.make_input(Path(tmp))
            cfg = cover.CoverConfig(data=str(src), out=str(Path(tmp) / "out"), copies=1, max_candidates=None,
                                    progress=False)
            result = cover.run(cfg)
            out = Path(tmp) / "out"
            train = [json.loads(l) for l in (out / "train.jsonl").read_text().splitlines()]
            before = [json.loads(l) for l in (src / "train.jsonl").read_text().splitlines()]
            added = [r for r in train if r["meta"]["mode"] == "answer_coverage"]
            self.assertEqual(len(added), result["examples"])
            self.assertEqual(len(train), len(before) + len(added))
            self.assertEqual(sorted(json.dumps(r) for r in train if r["meta"]["mode"] != "answer_coverage"),
                             sorted(json.dumps(r) for r in before))
            labels = [r["meta"]["target"] for r in added]
            self.assertEqual(len(labels), len(set(labels)))
            self.assertEqual(set(labels) | set(result["uncovered_words"]), set(self.solver.table.answers))
            self.assertEqual(result["test_words_as_labels"], len(set(labels) & set(self.splits["test"])))
            self.assertEqual((out / "valid.jsonl").read_text(), (src / "valid.jsonl").read_text())
            split_sets = {k: set(v) for k, v in self.splits.items()}
            allowed = set(self.solver.table.guesses)
            for r in added:
                self.assertIn(r["meta"]["secret"], split_sets["train"])     # never a test secret
                self.assertIsNone(replay_problem(r, PROMPT, allowed, "train", split_sets))
            stats = json.loads((out / "stats.json").read_text())
            self.assertEqual(stats["coverage"]["examples"], len(added))
            self.assertEqual(stats["prompt"], PROMPT.model_dump())

    def plain_and_changed(self, root: Path, **change) -> tuple[dict, dict, list[dict]]:
        """`cover` on one input with --max-candidates 5, as is and with `change`: (plain result, changed
        result, the changed folder's coverage records)."""
        src = self.make_input(root)
        plain = cover.run(cover.CoverConfig(data=str(src), out=str(root / "plain"), copies=1, progress=False))
        changed = cover.run(cover.CoverConfig(data=str(src), out=str(root / "changed"), progress=False,
                                              **{"copies": 1, **change}))
        records = [json.loads(l) for l in (root / "changed" / "train.jsonl").read_text().splitlines()]
        return plain, changed, [r for r in records if r["meta"]["mode"] == "answer_coverage"]

    def test_copies_repeat_each_coverage_example(self):
        with tempfile.TemporaryDirectory() as tmp:
            one, three, added = self.plain_and_changed(Path(tmp), copies=3)
            self.assertGreater(one["examples"], 0)
            self.assertEqual((three["examples"], three["records_added"]), (one["examples"], 3 * one["examples"]))
            counts = Counter(json.dumps(r) for r in added)
            self.assertEqual(set(counts.values()), {3})
            self.assertEqual(len(counts), one["examples"])

    def test_bad_inputs_are_one_line_errors_and_write_nothing(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            src = self.make_input(root)
            cases = [
                (cover.CoverConfig(data=str(src), out=str(src), progress=False), "is the input folder"),
                (cover.CoverConfig(data=str(root / "nowhere"), out=str(root / "o1"), progress=False),
                 "nowhere: no train.jsonl there"),
            ]
            think = self.make_input(root, PROMPT.model_copy(update={"require_think": True}), name="think")
            cases.append((cover.CoverConfig(data=str(think), out=str(root / "o2"), progress=False),
                          "require_think false"))
            (root / "o3src").mkdir()
            (root / "o3src" / "train.jsonl").write_text('{"messages": [{"role": "assistant", "content": "x"}]}\n')
            (root / "o3src" / "stats.json").write_text(json.dumps({"prompt": PROMPT.model_dump()}))
            cases.append((cover.CoverConfig(data=str(root / "o3src"), out=str(root / "o3"), progress=False),
                          "record 1: no meta.secret"))
            for cfg, why in cases:
                with self.assertRaises(UserError) as err:
                    cover.run(cfg)
                self.assertIn(why, str(err.exception))
                self.assertNotIn("\n", str(err.exception))
            for name in ("o1", "o2", "o3"):
                self.assertFalse((root / name).exists())

    def test_cli_names_a_bad_config_field(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cover.json"
            path.write_text(json.dumps({"data": "in", "out": "out", "copies": 0}))
            proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "data", "cover", "--config", str(path)],
                                  capture_output=True, text=True)
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("copies", proc.stderr)
            self.assertIn(str(path), proc.stderr)
            with self.assertRaises(UserError):
                load_config(path, cover.CoverConfig)
            path.write_text(json.dumps({"data": "in", "out": "out", "per_word": 2}))
            with self.assertRaisesRegex(UserError, "per_word: unknown field \\(got 2\\)$"):
                load_config(path, cover.CoverConfig)

    def test_data_options_before_a_subcommand_are_refused(self):
        for argv, fragment in ((["--out", "x", "--train-examples", "5", "cover"],
                                "data --out: an option of `data` alone, not of `data cover`; put it after the "
                                "subcommand: data cover --out"),
                               (["--train-examples", "5", "cover"], "`data cover` has no --train-examples"),
                               (["--seed", "1", "self-play"], "not of `data self-play`")):
            with self.subTest(argv=argv), tempfile.TemporaryDirectory() as tmp:
                proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "data", *argv], capture_output=True,
                                      text=True, cwd=tmp)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn(fragment, proc.stderr)
                self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
                self.assertEqual(list(Path(tmp).iterdir()), [])


if __name__ == "__main__":
    unittest.main()

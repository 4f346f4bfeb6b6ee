"""Tests for `wordle-mlx data` and the think-text writer: replay, splits, determinism, histogram, truthfulness."""

from __future__ import annotations

import json
import random
import re
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from wordle_mlx.config import load_config, validate_config
from wordle_mlx.errors import UserError
from wordle_mlx.game.feedback import feedback
from wordle_mlx.game.knowledge import candidates, is_consistent
from wordle_mlx.game.solver import Solver
from wordle_mlx.game.splits import split_answers
from wordle_mlx.game.thinking import check_candidates, split_groups, think_text
from wordle_mlx.game.words import answers
from wordle_mlx.llm.training.sft_data import read_sft_jsonl, replay_problem
from wordle_mlx.stages import data
from wordle_mlx.stages.pattern_table import load_table

MARK = {"green": "G", "yellow": "Y", "grey": "X"}
LINE_RE = re.compile(r"^\d+\. ([A-Z]{5}): (.*)$")


# The settings these tests were written for (the full prompt with a think block); `data`'s defaults are the 270M
# recipe's compact letters data.
FULL_THINK = {"think_style": "brief", "retry_fraction": 0.0,
              "max_copies": None, "history": {"k_weights": [0.2] * 5},
              "prompt": {"require_think": True, "style": "full", "guess_format": "word"}}


def write_config(folder: Path, **fields) -> Path:
    """A data config in `folder` writing `folder`/out: FULL_THINK with `fields` (prompt and history fields merged)."""
    merged = {**FULL_THINK, **fields}
    for section in ("prompt", "history"):
        merged[section] = {**FULL_THINK[section], **fields.get(section, {})}
    path = folder / "data.json"
    path.write_text(json.dumps({"out": str(folder / "out"), "progress": False, **merged}))
    return path


def board_from_prompt(text: str) -> list[tuple[str, str]]:
    """(guess, pattern) pairs read back from the user message, as a model would see them."""
    board = []
    for line in text.splitlines():
        m = LINE_RE.match(line)
        if m:
            marks = [MARK[part.split("=")[1]] for part in m.group(2).split()]
            board.append((m.group(1).lower(), "".join(marks)))
    return board


def random_boards(seed: int, words: list[str], tries: int, max_guesses: int):
    """(secret, history) for random secrets with 1..max_guesses random earlier guesses (never already won)."""
    rng = random.Random(seed)
    for _ in range(tries):
        secret = rng.choice(words)
        guesses = [rng.choice(words) for _ in range(rng.randint(1, max_guesses))]
        if secret not in guesses:
            yield secret, [(g, feedback(g, secret)) for g in guesses]


class DataGenerationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = Path(cls.tmp.name)
        cls.cfg_path = write_config(root, train_examples=60, valid_examples=20, think_style="full")
        cls.result = data.run(load_config(cls.cfg_path, data.DataConfig))
        cls.out = Path(cls.result["out"])
        cls.train = [json.loads(l) for l in (cls.out / "train.jsonl").read_text().splitlines()]
        cls.valid = [json.loads(l) for l in (cls.out / "valid.jsonl").read_text().splitlines()]
        cls.splits = split_answers(answers())
        cls.allowed = set(load_table(show_progress=False).guesses)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_counts_and_stats(self):
        self.assertEqual((len(self.train), len(self.valid)), (60, 20))
        stats = json.loads((self.out / "stats.json").read_text())
        self.assertEqual(stats["train"]["examples"], 60)
        self.assertEqual(stats["replay_check"], {"records": 80, "passed": 80})
        self.assertEqual(sum(stats["train"]["history_length_histogram"].values()), 60)
        self.assertEqual(stats["split_sizes"], {k: len(v) for k, v in self.splits.items()})

    def test_splits_disjoint_no_test_secret(self):
        test = set(self.splits["test"])
        for split, records in (("train", self.train), ("valid", self.valid)):
            for r in records:
                self.assertNotIn(r["meta"]["secret"], test)
                self.assertIn(r["meta"]["secret"], self.splits[split])

    def test_every_record_replays_through_the_engine(self):
        for r in self.train + self.valid:
            secret, history = r["meta"]["secret"], r["meta"]["history"]
            last_user = [m for m in r["messages"] if m["role"] == "user"][-1]["content"]
            board = board_from_prompt(last_user)
            self.assertEqual([g for g, _ in board], history)
            for guess, pattern in board:
                self.assertEqual(pattern, feedback(guess, secret))
            self.assertNotIn(secret, history)
            target = re.search(r"<guess>([a-z]{5})</guess>$", r["messages"][-1]["content"]).group(1)
            self.assertEqual(target, r["meta"]["target"])
            self.assertIn(target, self.allowed)
            self.assertNotIn(target, history)

    def test_mlx_lm_chat_format(self):
        for r in self.train:
            self.assertEqual([m["role"] for m in r["messages"][:2]], ["system", "user"])
            self.assertEqual(r["messages"][-1]["role"], "assistant")

    def test_deterministic_byte_identical(self):
        with tempfile.TemporaryDirectory() as other:
            path = write_config(Path(other), train_examples=60, valid_examples=20, think_style="full")
            data.run(load_config(path, data.DataConfig))
            for name in ("train.jsonl", "valid.jsonl", "stats.json"):
                ours = (self.out / name).read_bytes()
                theirs = (Path(other) / "out" / name).read_bytes()
                if name == "stats.json":
                    ours, theirs = (json.loads(x) for x in (ours, theirs))
                self.assertEqual(ours, theirs, name)

    def test_different_seed_differs(self):
        with tempfile.TemporaryDirectory() as other:
            path = write_config(Path(other), train_examples=60, valid_examples=20, think_style="full", seed=1)
            data.run(load_config(path, data.DataConfig))
            self.assertNotEqual((self.out / "train.jsonl").read_bytes(), (Path(other) / "out" / "train.jsonl").read_bytes())

    def test_target_is_the_best_splitting_candidate(self):
        solver = Solver(load_table(show_progress=False))
        for r in self.train + self.valid:
            history = [(g, feedback(g, r["meta"]["secret"])) for g in r["meta"]["history"]]
            self.assertIn(r["meta"]["target"], candidates(answers(), history))
            self.assertEqual(r["meta"]["target"], solver.best_candidate(solver.candidate_columns(history)))

    def test_teacher_plays_every_game_to_its_end(self):
        games = Counter()
        for r in self.train:
            games[r["meta"]["secret"], tuple(r["meta"]["history"][:r["meta"]["seeded"]])] += 1
        self.assertTrue(any(n > 1 for n in games.values()))       # several turns from one seeded start


class HistogramAndModesTest(unittest.TestCase):
    def test_history_lengths_follow_k_weights(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = write_config(Path(tmp), train_examples=1200, valid_examples=10, think_style="none",
                                prompt={"require_think": False}, history={"k_weights": [0.25, 0.75]})
            data.run(load_config(path, data.DataConfig))
            records = [json.loads(l) for l in (Path(tmp) / "out" / "train.jsonl").read_text().splitlines()]
            # each game's first example is its seeded start; the teacher's later turns add to its history
            starts = Counter(r["meta"]["seeded"] for r in records if len(r["meta"]["history"]) == r["meta"]["seeded"])
            total = sum(starts.values())
            self.assertEqual(set(starts), {0, 1})
            self.assertAlmostEqual(starts[0] / total, 0.25, delta=0.07)
            self.assertAlmostEqual(starts[1] / total, 0.75, delta=0.07)
            test = set(split_answers(answers())["test"])
            self.assertFalse({r["meta"]["secret"] for r in records} & test)


class ThinkTextTest(unittest.TestCase):
    COUNT_RE = re.compile(r"(\d+) words? fits?: ([a-z, ]+?)(?: and (\d+) more)?\.")

    def test_think_text_is_truthful(self):
        table = load_table(show_progress=False)
        solver = Solver(table)
        words = list(table.answers)
        checked = 0
        for secret, history in random_boards(7, words, 60, 3):
            cands = candidates(words, history)
            self.assertIsNone(check_candidates(history, cands, words))
            guess = solver.next_guess(history)
            for style in ("brief", "full"):
                text = think_text(history, cands, guess, style)
                if len(cands) == 1 and style == "full":
                    self.assertIn(f"Only {cands[0]} fits.", text)
                    continue
                m = self.COUNT_RE.search(text)
                self.assertIsNotNone(m, text)
                self.assertEqual(int(m.group(1)), len(cands))
                named = [w.strip().lower() for w in m.group(2).split(",")]
                for word in named:
                    self.assertTrue(is_consistent(word, history), (word, history))
                self.assertEqual(len(named) + int(m.group(3) or 0), len(cands))
                if style == "full":
                    groups = int(re.search(r"into (\d+) groups", text).group(1))
                    self.assertEqual(groups, len({feedback(guess, c) for c in cands}))
                    self.assertEqual("does not fit" in text, guess not in cands)
                    for green in re.findall(r"([A-Z]) at (\d)", text):
                        self.assertEqual(secret[int(green[1]) - 1], green[0].lower())
                checked += 1
        self.assertGreater(checked, 40)

    def test_pattern_style_is_truthful(self):
        words = list(answers())
        checked = 0
        for secret, history in random_boards(11, words, 80, 4):
            text = think_text(history, candidates(words, history), secret, "pattern")
            m = re.fullmatch(r"Pattern: ((?:[a-z_] ){4}[a-z_])\.(?: Also: ([a-z, ]+)\.)?(?: Out: ([a-z, ]+)\.)? "
                             r"Try ([a-z]{5})\.", text)
            self.assertIsNotNone(m, text)
            slots = m.group(1).split()
            shown = {i for i, c in enumerate(slots) if c != "_"}
            greens = {i for g, p in history for i, mark in enumerate(p) if mark == "G"}
            self.assertEqual(shown, greens, text)
            for i in shown:
                self.assertEqual(slots[i], secret[i])
            also = m.group(2).split(", ") if m.group(2) else []
            out = m.group(3).split(", ") if m.group(3) else []
            for letter in also:
                self.assertIn(letter, secret)
            for letter in out:
                self.assertNotIn(letter, secret)
            yellow = {g[i] for g, p in history for i, mark in enumerate(p) if mark == "Y"}
            self.assertTrue(yellow <= set(also) | {slots[i] for i in shown}, (text, history))
            self.assertEqual(m.group(4), secret)
            checked += 1
        self.assertGreater(checked, 60)
        self.assertEqual(think_text([], ["crane"], "raise", "pattern"), "No clues yet. Try raise.")

    def test_split_groups_and_none_style(self):
        self.assertEqual(split_groups("crane", ["crane", "crate", "trace"]), 3)
        self.assertIsNone(think_text([], ["crane"], "crane", "none"))


class RetryExamplesTest(unittest.TestCase):
    """`retry_fraction`: prompts that report an invalid previous reply exactly as the game engine does."""

    def test_retry_prompts_match_the_engine_and_replay(self):
        from wordle_mlx.llm.play.prompts import error_message, parse_reply
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_config(write_config(Path(tmp), train_examples=80, valid_examples=10, think_style="pattern", retry_fraction=0.5), data.DataConfig)
            result = data.run(cfg)
            records = [json.loads(l) for l in (Path(result["out"]) / "train.jsonl").read_text().splitlines()]
        allowed = set(load_table(show_progress=False).guesses)
        retries = [r for r in records if "retry_error" in r["meta"]]
        self.assertEqual(result["train"]["retry_examples"], len(retries))
        self.assertTrue(20 <= len(retries) <= 60, len(retries))
        kinds = set()
        for r in retries:
            kind, guess = r["meta"]["retry_error"]
            kinds.add(kind)
            self.assertEqual(parse_reply(f"<think>x</think><guess>{guess}</guess>", True, allowed).error, kind)
            self.assertTrue(r["messages"][1]["content"].startswith(f"{error_message(kind, guess)} Try again.\n"))
            self.assertTrue(r["messages"][-1]["content"].startswith(f"<think>{data.retry_note(kind, guess)} "))
        self.assertEqual(kinds, {"not_five_letters", "not_a_word"})
        for r in records:   # targets stay valid replies whatever the prompt says
            self.assertIsNone(parse_reply(r["messages"][-1]["content"], True, allowed).error)

    def test_zero_fraction_keeps_the_old_data(self):
        with tempfile.TemporaryDirectory() as tmp:
            runs = []
            for name, extra in (("a", {}), ("b", {"retry_fraction": 0.0})):
                folder = Path(tmp) / name
                folder.mkdir()
                cfg = write_config(folder, train_examples=30, valid_examples=5, **extra)
                runs.append(data.run(load_config(cfg, data.DataConfig)))
            a, b = runs
            self.assertEqual((Path(a["out"]) / "train.jsonl").read_text(), (Path(b["out"]) / "train.jsonl").read_text())
            self.assertEqual(a["train"]["retry_examples"], 0)

    def test_conversation_context_is_refused(self):
        with self.assertRaisesRegex(UserError, "retry_fraction"):
            validate_config({"retry_fraction": 0.1, "prompt": {"context": "conversation"}}, data.DataConfig, "x.json")


class RejectedWordTest(unittest.TestCase):
    """`prompt.rejected_word`: how the retry message shows a non-word."""

    def test_letters_message_in_both_contexts(self):
        from wordle_mlx.llm.play.prompts import PromptConfig, TurnText, build_messages
        board = [("raise", "XXGXX")]
        for form, shown in (("upper", "BOIND is not in the word list."), ("letters", "Not in the word list: b o i n d.")):
            cfg = PromptConfig(require_think=False, style="compact", guess_format="letters", rejected_word=form)
            summary = build_messages(cfg, board, last_error=("not_a_word", "boind"))[-1]["content"]
            self.assertTrue(summary.startswith(f"{shown} Try again.\n"), summary)
            conv = PromptConfig(**{**cfg.model_dump(), "context": "conversation"})
            turns = [TurnText("<guess> r a i s e</guess>", "raise", "XXGXX"),
                     TurnText("<guess> b o i n d</guess>", "boind", None, "not_a_word")]
            self.assertTrue(build_messages(conv, [], turns)[-1]["content"].startswith(f"{shown} Try again.\n"))
            # format errors read the same either way
            other = build_messages(cfg, board, last_error=("not_five_letters", "swan"))[-1]["content"]
            self.assertTrue(other.startswith("Your guess 'swan' is not 5 letters a-z. Try again.\n"), other)

    def test_retry_context_lists_earlier_errors_only_when_asked(self):
        from wordle_mlx.llm.play.prompts import PromptConfig, build_messages
        board, earlier = [("raise", "XXGXX")], [("not_a_word", "boind"), ("missing_guess", None)]
        base = PromptConfig(require_think=False, style="compact", guess_format="letters")
        self.assertEqual(base.retry_context, "last")
        last = build_messages(base, board, last_error=("not_a_word", "doint"), earlier_errors=earlier)
        self.assertEqual(last, build_messages(base, board, last_error=("not_a_word", "doint")))
        cfg = PromptConfig(**{**base.model_dump(), "retry_context": "turn", "rejected_word": "letters"})
        text = build_messages(cfg, board, last_error=("not_a_word", "doint"), earlier_errors=earlier)[-1]["content"]
        self.assertTrue(text.startswith("Not in the word list: b o i n d.\nYour reply had no <guess> </guess> tag.\n"
                                        "Not in the word list: d o i n t. Try again.\n"), text)
        self.assertEqual(build_messages(cfg, board)[-1]["content"], build_messages(base, board)[-1]["content"])
        with self.assertRaises(ValueError):
            PromptConfig(retry_context="all")

    def test_data_stage_writes_and_replays_letters_messages(self):
        with tempfile.TemporaryDirectory() as tmp:
            outs = {}
            for form in ("upper", "letters", None):
                folder = Path(tmp) / str(form)
                folder.mkdir()
                prompt = {"require_think": False, "style": "compact", "guess_format": "letters"}
                if form is not None:
                    prompt["rejected_word"] = form
                cfg = write_config(folder, train_examples=60, valid_examples=5, think_style="none", retry_fraction=0.5, prompt=prompt)
                result = data.run(load_config(cfg, data.DataConfig))   # run replays every record through the engine
                outs[form] = [json.loads(l) for l in (Path(result["out"]) / "train.jsonl").read_text().splitlines()]
        self.assertEqual(outs[None], outs["upper"])   # the default is the old message
        words = [r for r in outs["letters"] if r["meta"].get("retry_error", [None])[0] == "not_a_word"]
        self.assertGreater(len(words), 3)
        for r in words:
            guess = r["meta"]["retry_error"][1]
            self.assertTrue(r["messages"][1]["content"].startswith(f"Not in the word list: {' '.join(guess)}. Try again.\n"))
        for a, b in zip(outs["upper"], outs["letters"]):   # only that message differs
            if a["meta"].get("retry_error", [None])[0] != "not_a_word":
                self.assertEqual(a, b)
            else:
                self.assertEqual(a["messages"][1]["content"].split("\n", 1)[1], b["messages"][1]["content"].split("\n", 1)[1])






def parse_clues(text: str) -> tuple[str, dict[str, list[int]], set[str]]:
    """(pattern, {letter: positions it is not at}, absent letters) read back from a compact prompt."""
    pattern, has, absent = "_____", {}, set()
    for line in text.splitlines():
        head, _, rest = line.partition(": ")
        if head == "Pattern":
            pattern = rest.replace(" ", "")
        elif head == "Has":
            for part in rest.split(", "):
                letter, _, where = part.partition(" (not ")
                has[letter] = [int(p) - 1 for p in where.rstrip(")").split()] if where else []
        elif head == "Not":
            absent = set(rest.split())
    return pattern, has, absent


def fits_clues(word: str, clues) -> bool:
    pattern, has, absent = clues
    return (all(p == "_" or p == c for p, c in zip(pattern, word)) and not set(word) & absent
            and all(letter in word and all(word[i] != letter for i in where) for letter, where in has.items()))


class CompactLettersTest(unittest.TestCase):
    """The compact prompt (derived clues only) and the letters guess format (`<guess> c r a n e</guess>`)."""

    def test_compact_clues_are_truthful_and_prune(self):
        from wordle_mlx.llm.play.prompts import PromptConfig, build_messages
        cfg = PromptConfig(style="compact", require_think=False)
        words = answers()
        board = [("raise", feedback("raise", "fetch")), ("betel", feedback("betel", "fetch"))]
        self.assertEqual(build_messages(cfg, board)[1]["content"], "Pattern: _ e t _ _\nNot: a b i l r s")
        self.assertEqual(build_messages(cfg, [])[1]["content"], "No clues yet.")
        self.assertEqual(build_messages(cfg, [("crane", feedback("crane", "react"))])[1]["content"],
                         "Pattern: _ _ a _ _\nHas: c (not 1), e (not 5), r (not 2)\nNot: n")
        for secret, history in random_boards(5, words, 150, 3):
            clues = parse_clues(build_messages(cfg, history)[1]["content"])
            consistent = candidates(words, history)
            self.assertIn(secret, consistent)
            # truthful: every word that fits the feedback fits the clues (the clues drop only count limits)
            self.assertTrue(all(fits_clues(w, clues) for w in consistent), history)
            fitting = [w for w in words if fits_clues(w, clues)]
            self.assertLessEqual(len(consistent), len(fitting))
            self.assertLess(len(fitting), len(words))

    def test_letters_targets_parse_and_only_the_reply_changes(self):
        from wordle_mlx.llm.play.prompts import parse_reply
        allowed = set(load_table(show_progress=False).guesses)
        with tempfile.TemporaryDirectory() as tmp:
            runs = []
            for name, fmt in (("word", "word"), ("letters", "letters")):
                folder = Path(tmp) / name
                folder.mkdir()
                prompt = {"require_think": False, "style": "compact", "guess_format": fmt}
                cfg = write_config(folder, train_examples=40, valid_examples=5,
                                   think_style="none", prompt=prompt)
                out = Path(data.run(load_config(cfg, data.DataConfig))["out"])
                runs.append([json.loads(l) for l in (out / "train.jsonl").read_text().splitlines()])
        for a, b in zip(*runs):
            self.assertEqual(a["meta"], b["meta"])
            self.assertEqual(a["messages"][1:-1], b["messages"][1:-1])     # same boards; the instruction differs
            target = a["meta"]["target"]
            self.assertEqual(a["messages"][-1]["content"], f"<guess>{target}</guess>")
            self.assertEqual(b["messages"][-1]["content"], f"<guess> {' '.join(target)}</guess>")
            self.assertEqual(parse_reply(b["messages"][-1]["content"], False, allowed).guess, target)
            self.assertIn("<guess> w o r d s</guess>", b["messages"][0]["content"])
            self.assertNotIn("Your guesses so far", a["messages"][1]["content"])

    def test_parser_reads_letters_only_as_five_single_letters(self):
        from wordle_mlx.llm.play.prompts import MISSING_THINK, NOT_A_WORD, NOT_FIVE_LETTERS, parse_reply
        allowed = {"crane"}
        self.assertEqual(parse_reply("<guess> C R A N E </guess>", False, allowed).guess, "crane")
        self.assertEqual(parse_reply("<guess>c r a n x</guess>", False, allowed).error, NOT_A_WORD)
        for bad in ("c r a n", "c r a n e s", "cr a n e", "c  r a n e", "c,r,a,n,e"):
            self.assertEqual(parse_reply(f"<guess>{bad}</guess>", False, allowed).error, NOT_FIVE_LETTERS, bad)
        self.assertEqual(parse_reply("<guess>c r a n e</guess>", True, allowed).error, MISSING_THINK)


class MaxCopiesTest(unittest.TestCase):
    def test_no_example_more_than_max_copies_and_impossible_counts_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = write_config(Path(tmp), train_examples=120, valid_examples=10, max_copies=2,
                               think_style="none", prompt={"require_think": False, "style": "compact"},
                               history={"k_weights": [0.7, 0.3]})
            result = data.run(load_config(cfg, data.DataConfig))
            records = [json.loads(l) for l in (Path(result["out"]) / "train.jsonl").read_text().splitlines()]
            counts = Counter(json.dumps(r["messages"]) for r in records)
            self.assertEqual(len(records), 120)
            self.assertEqual(max(counts.values()), 2)          # the opener board, kept twice
            self.assertEqual(result["train"]["distinct_examples"], len(counts))
            # empty boards only, one copy each: the valid split's 100 teacher games have fewer distinct boards
            cfg = write_config(Path(tmp), train_examples=10, valid_examples=2000, max_copies=1,
                               think_style="none", prompt={"require_think": False, "style": "compact"},
                               history={"k_weights": [1.0]})
            with self.assertRaisesRegex(UserError, "max_copies 1 leaves fewer than the 2000 valid examples"):
                data.run(load_config(cfg, data.DataConfig))


def teacher_board_traffic(solver: Solver, words: list[str]) -> Counter:
    """How many of `words`' teacher games from the empty board pass through each (board, teacher reply),
    each game followed here with its own loop (an oracle independent of data.sft_examples)."""
    traffic = Counter()
    for secret in words:
        history = []
        while not history or history[-1][0] != secret:
            guess = solver.best_candidate(solver.candidate_columns(history))
            traffic[(tuple(history), guess)] += 1
            history.append((guess, feedback(guess, secret)))
    return traffic


class EmptyBoardCopiesTest(unittest.TestCase):
    def test_every_empty_board_teacher_example_exactly_n_times(self):
        table = load_table(show_progress=False)
        solver = Solver(table)
        words = split_answers(answers())["train"][:25]
        cfg = data.DataConfig(think_style="none", empty_board_copies=3,
                              retry_fraction=0.5, prompt={"require_think": False, "style": "compact",
                                                          "guess_format": "letters"})
        records = data.empty_board_examples(words, cfg, random.Random(0), solver)
        counts = Counter(json.dumps(r["messages"]) for r in records)
        self.assertEqual(set(counts.values()), {3})
        # the boards are exactly those of the teacher's games, each game played to the end, no retries
        boards = set(teacher_board_traffic(solver, words))
        got = {(tuple((g, feedback(g, r["meta"]["secret"])) for g in r["meta"]["history"]), r["meta"]["target"])
               for r in records}
        self.assertLessEqual(got, boards)             # boards with the same clues and reply are one example
        self.assertGreaterEqual(len(got), 0.9 * len(boards))
        self.assertFalse(any("retry_error" in r["meta"] for r in records))
        splits = {k: set(v) for k, v in split_answers(answers()).items()}
        allowed = set(table.guesses)
        for r in records:
            self.assertIsNone(replay_problem(r, cfg.prompt, allowed, "train", splits))

    def test_traffic_cap_weights_boards_by_games_through_them(self):
        solver = Solver(load_table(show_progress=False))
        words = split_answers(answers())["train"][:40]
        cfg = data.DataConfig(think_style="none", empty_board_copies=2,
                              empty_board_traffic_cap=3, prompt={"require_think": False, "style": "compact",
                                                                 "guess_format": "letters"})
        counts = Counter(json.dumps(r["messages"]) for r in
                         data.empty_board_examples(words, cfg, random.Random(0), solver))
        # traffic counted independently: how many of the 40 games pass through each (board, teacher reply)
        traffic = teacher_board_traffic(solver, words)
        opener = [k for k in traffic if k[0] == ()]
        self.assertEqual(len(opener), 1)
        self.assertEqual(traffic[opener[0]], 40)
        self.assertEqual(max(counts.values()), 2 * 3)          # the opener board: 40 games, capped at 3
        self.assertEqual(sorted(Counter(2 * min(t, 3) for t in traffic.values()).elements()),
                         sorted(counts.values()))


class BadInputTest(unittest.TestCase):
    def test_unknown_field(self):
        with self.assertRaisesRegex(UserError, "think_styl: unknown field"):
            validate_config({"think_styl": "brief"}, data.DataConfig, "x.json")

    def test_invalid_values(self):
        with self.assertRaisesRegex(UserError, "think_style"):
            validate_config({"think_style": "long"}, data.DataConfig, "x.json")
        with self.assertRaisesRegex(UserError, "require_think"):
            validate_config({"think_style": "none", "prompt": {"require_think": True}}, data.DataConfig, "x.json")
        with self.assertRaisesRegex(UserError, "k_weights"):
            validate_config({"history": {"k_weights": [-1, 1]}}, data.DataConfig, "x.json")

    def test_removed_fields_are_unknown_fields(self):
        for fields, fragment in (({"turns_per_game": 2}, "x.json: turns_per_game: unknown field (got 2)"),
                                 ({"candidate_threshold": 3}, "x.json: candidate_threshold: unknown field (got 3)"),
                                 ({"max_named": 3}, "x.json: max_named: unknown field (got 3)"),
                                 ({"history": {"solver": 0.4}}, "x.json: history.solver: unknown field (got 0.4)")):
            with self.subTest(fields=fields), self.assertRaises(UserError) as ctx:
                validate_config(fields, data.DataConfig, "x.json")
            self.assertIn(fragment, str(ctx.exception))
            self.assertEqual(len(str(ctx.exception).splitlines()), 1)

    def test_jsonl_schema_error_names_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "train.jsonl"
            good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
            path.write_text(json.dumps(good) + "\n" + json.dumps({"messages": [{"role": "robot", "content": 1}]}) + "\n")
            with self.assertRaisesRegex(UserError, r"train\.jsonl:2: messages\[0\]"):
                read_sft_jsonl(path)
            path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
            with self.assertRaisesRegex(UserError, r":1: the last message must be the assistant"):
                read_sft_jsonl(path)
            with self.assertRaisesRegex(UserError, "file not found"):
                read_sft_jsonl(Path(tmp) / "missing.jsonl")


if __name__ == "__main__":
    unittest.main()

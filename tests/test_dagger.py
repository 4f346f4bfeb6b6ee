"""`wordle-mlx dagger`: on-policy boards, each with exactly the prompt the model saw and the teacher's reply."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from tests.test_rollout import ALLOWED, Scripted, tiny
from wordle_mlx.config import load_config
from wordle_mlx.errors import UserError
from wordle_mlx.game.feedback import feedback
from wordle_mlx.game.solver import Solver
from wordle_mlx.game.splits import split_answers
from wordle_mlx.llm.prompts import NOT_A_WORD, NOT_FIVE_LETTERS, PromptConfig
from wordle_mlx.llm.rollout import GameSpec, RolloutConfig, play_games
from wordle_mlx.stages import dagger, data
from wordle_mlx.stages.entropy import load_table

PROMPT = PromptConfig(require_think=False, context="summary", style="compact", guess_format="letters")


def letters(word: str) -> str:
    return f"<guess> {' '.join(word)}</guess>"


def teacher_games(solver: Solver, secret: str) -> list[str]:
    """The teacher's whole game for `secret` from the empty board, through the data stage's own generator."""
    cfg = data.DataConfig(think_style="none", candidate_threshold=100000, turns_per_game=6, prompt=PROMPT,
                          progress=False)
    records = data.sft_examples(secret, cfg, None, solver, cfg.history.policy(), empty_board=True)
    return [r["meta"]["target"] for r in records]


class EpisodeRecordsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.solver = Solver(load_table(show_progress=False))
        cls.tok = tiny()[1]
        cls.secret = split_answers(cls.solver.table.answers)["train"][0]
        cls.teacher = teacher_games(cls.solver, cls.secret)
        # the "model": the teacher's opener, a non-word, a six-letter reply, an off-path word, then the
        # teacher's move for the board that reached (so the first and last turns agree with the teacher)
        cls.off_path = next(w for w in cls.solver.table.answers if w not in (cls.secret, *cls.teacher[:2]))
        history = [(g, feedback(g, cls.secret)) for g in (cls.teacher[0], cls.off_path)]
        cls.last_move = data.teacher_guess(cls.solver, cls.solver.candidate_columns(history), 100000)
        replies = [letters(cls.teacher[0]), letters("qzqzq"), "<guess> a b c d e f</guess>", letters(cls.off_path),
                   letters(cls.last_move)]
        cls.cfg = dagger.DaggerConfig(out="unused", rollout=RolloutConfig(prompt=PROMPT))
        backend = Scripted(cls.tok, [[r] for r in replies])
        play = RolloutConfig(prompt=PROMPT, max_turns=5)
        cls.episode = play_games(None, cls.tok, [GameSpec(cls.secret)], play, ALLOWED, generate_fn=backend)[0]
        cls.records = dagger.episode_records(cls.episode, cls.cfg, cls.solver)

    def test_one_record_per_model_turn_with_the_prompt_the_model_saw(self):
        self.assertEqual(len(self.episode.turns), 5)
        self.assertEqual(len(self.records), len(self.episode.turns))
        for record, turn in zip(self.records, self.episode.turns):
            ids = self.tok.apply_chat_template(record["messages"][:-1], add_generation_prompt=True)
            self.assertEqual(list(ids), turn.prompt_tokens)

    def test_targets_are_the_teacher_moves_for_each_board(self):
        first, after_opener, retry1, retry2, last = self.records
        self.assertEqual(first["meta"]["target"], self.teacher[0])
        # three turns on the board after the opener (the first reply, then two retries): the teacher's second move
        for record in (after_opener, retry1, retry2):
            self.assertEqual(record["meta"]["history"], [self.teacher[0]])
            self.assertEqual(record["meta"]["target"], self.teacher[1])
        self.assertNotIn("retry_error", after_opener["meta"])
        self.assertEqual(retry1["meta"]["retry_error"], [NOT_A_WORD, "qzqzq"])
        self.assertIn("QZQZQ is not in the word list. Try again.", retry1["messages"][1]["content"])
        self.assertEqual(retry2["meta"]["retry_error"][0], NOT_FIVE_LETTERS)
        self.assertEqual(last["meta"]["history"], [self.teacher[0], self.off_path])
        self.assertEqual(last["messages"][-1]["content"], letters(self.last_move))

    def test_every_record_passes_the_data_replay_check(self):
        check = data.DataConfig(think_style="none", prompt=PROMPT, progress=False)
        splits = {k: set(v) for k, v in split_answers(self.solver.table.answers).items()}
        for record in self.records:
            self.assertIsNone(data.replay_problem(record, check, set(ALLOWED), "train", splits))

    def test_only_disagreements_drops_the_turns_that_matched_the_teacher(self):
        cfg = self.cfg.model_copy(update={"only_disagreements": True})
        kept = dagger.episode_records(self.episode, cfg, self.solver)
        agreed = [r for r in self.records if r["meta"]["model_guess"] == r["meta"]["target"]
                  and r["meta"]["model_error"] is None]
        self.assertEqual(len(agreed), 2)          # the opener and the last move
        self.assertEqual(len(kept), len(self.records) - 2)
        self.assertTrue(all(r["meta"]["model_guess"] != r["meta"]["target"] or r["meta"]["model_error"]
                            for r in kept))


class DaggerRunTest(unittest.TestCase):
    def test_run_writes_mixed_checked_data_without_test_secrets(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            data.run(data.DataConfig(out=str(root / "base"), train_examples=6, valid_examples=3, think_style="none",
                                     prompt=PROMPT, progress=False))
            path = root / "dagger.json"
            path.write_text(json.dumps({
                "model": "builtin:tiny-random", "out": str(root / "out"), "base_data": str(root / "base"),
                "train_games": 3, "valid_games": 2, "copies": 2, "progress": False,
                "rollout": {"max_tokens_per_turn": 6, "max_invalid_replies": 2, "prompt": PROMPT.model_dump()}}))
            result = dagger.run(load_config(path, dagger.DaggerConfig))
            train = [json.loads(l) for l in (root / "out" / "train.jsonl").read_text().splitlines()]
            on_policy = [r for r in train if r["meta"]["mode"] == "on_policy"]
            self.assertEqual(len(train) - len(on_policy), 6)
            self.assertEqual(len(on_policy), 2 * result["train"]["boards"])
            self.assertGreaterEqual(result["train"]["boards"], 3 * 2)  # a random model: 2 invalid replies a game
            splits = split_answers()
            self.assertEqual({r["meta"]["secret"] for r in on_policy} & set(splits["test"]), set())
            self.assertTrue({r["meta"]["secret"] for r in on_policy} <= set(splits["train"]))
            self.assertEqual(json.loads((root / "out" / "stats.json").read_text())["valid"]["games"], 2)

    def test_missing_base_data_and_too_many_games_are_user_errors(self):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = dagger.DaggerConfig(out=str(Path(tmp) / "out"), base_data=str(Path(tmp) / "nope"),
                                      rollout=RolloutConfig(prompt=PROMPT), progress=False)
            with self.assertRaisesRegex(UserError, "base_data .*nope.*no train.jsonl"):
                dagger.run(cfg)
            with self.assertRaisesRegex(UserError, "valid_games 101 is more than the 100 words"):
                dagger.secrets_for(split_answers()["valid"], 101, 0, "valid")


if __name__ == "__main__":
    unittest.main()

"""`wordle-mlx eval` and `wordle-mlx play` on the tiny random model (fast); the decoding an adapter records is
what they use by default, and free decoding of an adapter whose tags were never trained warns."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import unittest
from pathlib import Path

from wordle_mlx.config import load_config
from wordle_mlx.errors import UserError
from wordle_mlx.game.splits import split_words
from wordle_mlx.llm.play.reply_grammar import adapter_decoding
from wordle_mlx.llm.play.rollout import RolloutConfig
from wordle_mlx.stages import evaluate, play

from tests.dtype_models import write_adapter

SHIPPED = Path(__file__).resolve().parents[1] / "adapters" / "gemma-3-270m-wordle"

SUMMARY_KEYS = {"games", "wins", "win_rate", "win_rate_ci95", "mean_guesses_on_wins", "histogram", "format_error_rate",
                "invalid_rate", "repeat_rate", "consistent_rate", "mean_completion_tokens", "tokens_per_second",
                "tokens_per_game", "seconds", "game_records"}
TOP_KEYS = {"kind", "model", "adapter", "split", "history", "temperature", "seed", "baselines"} | SUMMARY_KEYS


def eval_cfg(**overrides):
    base = {"model": "builtin:tiny-random", "games": 3, "rollout.max_tokens_per_turn": 8,
            "rollout.max_invalid_replies": 2, "rollout.decode": "free", "progress": False, "json_output": True}
    base.update(overrides)
    return load_config(None, evaluate.EvalConfig, base)


def strip_timings(result: dict) -> dict:
    out = {k: v for k, v in result.items() if k not in evaluate.TIMING_KEYS}
    if "baselines" in out:
        out["baselines"] = {name: strip_timings(b) for name, b in out["baselines"].items()}
    return out


class TestEval(unittest.TestCase):
    def test_json_keys_determinism_and_solver_baseline(self):
        first = evaluate.run(eval_cfg())
        self.assertTrue(TOP_KEYS <= set(first), TOP_KEYS - set(first))
        self.assertEqual(first["kind"], "eval")
        self.assertEqual([g["secret"] for g in first["game_records"]], split_words("test")[:3])
        self.assertEqual(set(first["histogram"]), {"1", "2", "3", "4", "5", "6", "lost"})
        self.assertEqual(sum(first["histogram"].values()), 3)
        solver = first["baselines"]["solver"]
        self.assertTrue(SUMMARY_KEYS <= set(solver))
        self.assertEqual(solver["win_rate"], 1.0)
        self.assertTrue(0.0 < solver["consistent_rate"] <= 1.0)   # max-entropy probes need not fit the feedback
        self.assertEqual(solver["format_error_rate"], 0.0)
        # no adapter: the model is the base model, reported under baselines.base_model too (not replayed)
        self.assertTrue(first["baselines"]["base_model"]["same_as_model"])
        self.assertEqual(first["baselines"]["base_model"]["win_rate"], first["win_rate"])
        # the random tiny model never closes a <guess> tag: every turn is a format error at the length cap
        self.assertEqual(first["format_error_rate"], 1.0)
        self.assertEqual(first["mean_completion_tokens"], 8.0)
        self.assertEqual(first["wins"], 0)
        second = evaluate.run(eval_cfg())
        self.assertEqual(strip_timings(first), strip_timings(second))

    def test_seeded_history_out_file_and_solver_from_same_boards(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp, "sub", "eval.json")
            result = evaluate.run(eval_cfg(history="seeded", games=6, seed=3, out=str(out)))
            self.assertEqual(json.loads(out.read_text()), json.loads(json.dumps(result)))
        seeded = [g["seeded"] for g in result["game_records"]]
        self.assertTrue(any(seeded), seeded)
        for model_game, solver_game in zip(result["game_records"], result["baselines"]["solver"]["game_records"]):
            n = model_game["seeded"]
            self.assertEqual(solver_game["seeded"], n)
            self.assertEqual(model_game["guesses"][:n], solver_game["guesses"][:n])
        self.assertEqual(result["baselines"]["solver"]["win_rate"], 1.0)
        again = evaluate.run(eval_cfg(history="seeded", games=6, seed=3, baselines=False))
        self.assertEqual([g["guesses"] for g in again["game_records"]], [g["guesses"] for g in result["game_records"]])
        self.assertNotIn("baselines", again)

    def test_timeout_names_unfinished_game(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp, "eval.json")
            with self.assertRaisesRegex(UserError, r"timed out .* game 0 \(secret"):
                evaluate.run(eval_cfg(timeout=1e-9, out=str(out)))
            partial = json.loads(out.read_text())
        self.assertTrue(partial["timed_out"])
        self.assertEqual(len(partial["unfinished"]), 3)

    def test_bad_inputs(self):
        with self.assertRaisesRegex(UserError, "split"):
            eval_cfg(split="holdout")
        with self.assertRaisesRegex(UserError, "more than the 200 words"):
            evaluate.run(eval_cfg(games=201))

    def test_wilson_interval(self):
        self.assertEqual(evaluate.wilson_interval(61, 200), [0.2454, 0.372])
        self.assertEqual(evaluate.wilson_interval(0, 3)[0], 0.0)
        self.assertEqual(evaluate.wilson_interval(3, 3)[1], 1.0)


class AdapterDecodingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.adapter = Path(cls._tmp.name) / "adapter"
        write_adapter(cls.adapter)
        cls.config = json.loads((cls.adapter / "adapter_config.json").read_text())

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def record(self, **entries) -> str:
        (self.adapter / "adapter_config.json").write_text(json.dumps({**self.config, **entries}))
        return str(self.adapter)

    def run_eval(self, adapter: str, **overrides) -> tuple[dict, str]:
        cfg = {"model": "builtin:tiny-random", "adapter": adapter, "games": 2, "rollout.max_invalid_replies": 2,
               "progress": False, "json_output": True, "baselines": False, **overrides}
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            result = evaluate.run(load_config(None, evaluate.EvalConfig, cfg))
        return result, err.getvalue()

    def test_eval_plays_the_recorded_decoding_unless_told_otherwise(self):
        adapter = self.record(decode="words", trained_free=False)
        result, err = self.run_eval(adapter)
        self.assertEqual(result["decode"], "words")
        self.assertEqual((result["invalid_rate"], result["format_error_rate"], result["repeat_rate"]), (0.0, 0.0, 0.0))
        self.assertEqual(err, "")
        self.assertEqual(self.run_eval(adapter, **{"rollout.decode": "grammar"})[0]["decode"], "grammar")
        self.assertEqual(self.run_eval(self.record())[0]["decode"], "grammar")      # no record: today's default
        adapter = self.record(decode="words", trained_free=False)
        self.assertEqual(RolloutConfig().for_adapter(adapter).decode, "words")    # play's default too

    def test_the_shipped_adapter_plays_words_decoding_by_default(self):
        """`eval --adapter adapters/gemma-3-270m-wordle` plays the game's rule, and its whole reply was trained
        over the vocabulary, so `--decode free` (Ollama, plain mlx_lm.generate) gives no warning."""
        self.assertEqual(adapter_decoding(SHIPPED), ("words", True))
        self.assertEqual(RolloutConfig().for_adapter(SHIPPED).decode, "words")

    def test_free_decoding_warns_when_the_whole_reply_was_never_trained(self):
        result, err = self.run_eval(self.record(decode="grammar", trained_free=False), **{"rollout.decode": "free",
                                                                                          "rollout.max_tokens_per_turn": 8})
        self.assertEqual(result["decode"], "free")
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn("never on the whole reply", err)
        self.assertIn("--decode grammar", err)
        for entries in ({"decode": "grammar", "trained_free": True}, {}):
            _, err = self.run_eval(self.record(**entries), **{"rollout.decode": "free", "rollout.max_tokens_per_turn": 8})
            self.assertEqual(err, "", entries)
        # an older adapter's trained_tags: its tags alone were trained unless it was trained free
        self.assertEqual(adapter_decoding(self.record(decode="words", trained_tags=True)), ("words", False))
        self.assertEqual(adapter_decoding(self.record(decode="free", trained_tags=True)), ("free", True))

    def test_a_bad_record_is_a_one_line_error(self):
        with self.assertRaisesRegex(UserError, "adapter_config.json: decode: unknown mode 'fast'"):
            adapter_decoding(self.record(decode="fast"))


class TestPlay(unittest.TestCase):
    def play_cfg(self, **overrides):
        base = {"model": "builtin:tiny-random", "rollout.max_tokens_per_turn": 6, "rollout.max_invalid_replies": 2}
        base.update(overrides)
        return load_config(None, play.PlayConfig, base)

    def test_human_game_with_rejections_and_hints(self):
        inputs = iter(["abc", "zzzzz", "?", "slate", "CRANE"])
        printed: list[str] = []
        result = play.run(self.play_cfg(secret="crane", human=True), input_fn=lambda _: next(inputs),
                          print_fn=lambda *a: printed.append(" ".join(map(str, a))))
        self.assertEqual(result, {"secret": "crane", "won": True, "guesses": ["slate", "crane"]})
        text = "\n".join(printed)
        self.assertIn("has 3 letters", text)
        self.assertIn("not in the allowed word list", text)
        self.assertIn("model suggests:", text)
        self.assertIn("solver suggests: ", text)
        self.assertIn("you won in 2", text)

    def test_human_gives_up_on_end_of_input(self):
        def no_input(_):
            raise EOFError

        result = play.run(self.play_cfg(secret="crane", human=True), input_fn=no_input, print_fn=lambda *a: None)
        self.assertEqual(result["guesses"], [])
        self.assertFalse(result["won"])

    def test_model_game_shows_turns(self):
        printed: list[str] = []
        result = play.run(self.play_cfg(seed=4), print_fn=lambda *a: printed.append(" ".join(map(str, a))))
        self.assertIn(result["secret"], split_words("test"))
        self.assertEqual(result["invalid_replies"], 2)
        self.assertEqual(sum("invalid reply" in line for line in printed), 2)

    def test_bad_secret(self):
        with self.assertRaisesRegex(UserError, "--secret"):
            play.run(self.play_cfg(secret="xyzzy"))


if __name__ == "__main__":
    unittest.main()

"""`--report-to`: MetricsWriter forwards records to TensorBoard (read back with TensorBoard's own reader) or wandb.

The JSONL lines must not change; unknown names and a missing wandb are one-line UserErrors; wandb is tested
with a stand-in module, never the real service.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import types
import unittest
from pathlib import Path
from unittest import mock

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from wordle_mlx.errors import UserError
from wordle_mlx.llm.training.distributed import NullWriter
from wordle_mlx.storage.metrics import MetricsWriter
from wordle_mlx.storage.reporting import REPORT_TO_CHOICES, parse_report_to, scalars

RECORDS = [
    {"kind": "run", "stage": "grpo", "run": "grpo", "config_hash": "a1b2c3d4e5", "config": {"rl": {"lr": 0.02}},
     "time": 1763767800.0, "resumed_from_step": None, "world_size": 1},
    {"kind": "valid", "step": 0, "time": 1763767810.0, "win_rate": 0.25, "mean_guesses": None, "best": True,
     "games": [{"secret": "crane", "won": True, "guesses": ["crane"], "seeded": 0}]},
    {"kind": "train", "step": 1, "time": 1763767900.0, "lr": 0.02, "loss": 0.013, "kl": math.nan,
     "grad_norm": 0.8, "tokens_generated": 5120, "rewards": {"win": {"mean": 0.25, "std": 0.43}},
     "games": [{"secret": "crane", "won": False, "guesses": ["soare"], "seeded": 1}]},
    {"kind": "train", "step": 2, "time": 1763767990.0, "lr": 0.019, "loss": 123456.789, "kl": 0.001,
     "grad_norm": 0.7, "tokens_generated": 4096, "rewards": {"win": {"mean": 0.5, "std": 0.5}}, "games": []},
]


def close(test: unittest.TestCase, actual: float, expected: float) -> None:
    test.assertAlmostEqual(actual, expected, delta=1e-6 * abs(expected) + 1e-7)  # stored as float32


class ReportToTest(unittest.TestCase):
    def test_tensorboard_events_read_back_and_jsonl_unchanged(self):
        with tempfile.TemporaryDirectory() as d:
            plain, reported = Path(d, "plain", "metrics.jsonl"), Path(d, "run", "metrics.jsonl")
            with MetricsWriter(plain) as w:
                for record in RECORDS:
                    w.write(record)
            with MetricsWriter(reported, report_to=("tensorboard",), run_name="run") as w:
                for record in RECORDS:
                    w.write(record)
            self.assertEqual(reported.read_text(), plain.read_text())

            acc = EventAccumulator(str(Path(d, "run", "tensorboard")))
            acc.Reload()
            tags = set(acc.Tags()["scalars"])
            self.assertEqual(tags, {"valid/win_rate", "train/lr", "train/loss", "train/kl", "train/grad_norm",
                                    "train/tokens_generated", "train/rewards/win/mean", "train/rewards/win/std"})
            for tag in sorted(tags):
                kind, field = tag.split("/", 1)
                expected = []
                for record in RECORDS:
                    if record["kind"] != kind:
                        continue
                    value = record
                    for key in field.split("/"):
                        value = value[key]
                    if isinstance(value, float) and math.isnan(value):
                        continue          # written as null in the JSONL, so not reported
                    expected.append((record["step"], record["time"], value))
                events = acc.Scalars(tag)
                self.assertEqual([e.step for e in events], [s for s, _, _ in expected], tag)
                for event, (_, wall_time, value) in zip(events, expected):
                    close(self, event.value, value)
                    self.assertEqual(event.wall_time, wall_time)

            self.assertIn("run/config", acc.Tags()["tensors"])
            (text_event,) = acc.Tensors("run/config")
            self.assertEqual(text_event.step, 0)
            text = text_event.tensor_proto.string_val[0].decode()
            self.assertEqual(json.loads(text), RECORDS[0])

    def test_scalars_flatten_dicts_and_skip_the_rest(self):
        record = {"kind": "sft", "step": 3, "time": 1.0, "loss": 1.5, "tokens": 7, "ok": True, "name": "x",
                  "none": None, "games": [1, 2], "nested": {"a": {"b": 2}, "c": "s"}}
        self.assertEqual(scalars(record), {"sft/loss": 1.5, "sft/tokens": 7.0, "sft/nested/a/b": 2.0})

    def test_parse_report_to(self):
        self.assertEqual(REPORT_TO_CHOICES, ("tensorboard", "wandb"))
        self.assertEqual(parse_report_to(None), ())
        self.assertEqual(parse_report_to(""), ())
        self.assertEqual(parse_report_to(" TensorBoard, ,tensorboard"), ("tensorboard",))
        with self.assertRaises(UserError) as ctx:
            parse_report_to("tensorboard,mlflow")
        self.assertEqual(str(ctx.exception), "--report-to mlflow: unknown name; choose from tensorboard, wandb")
        with tempfile.TemporaryDirectory() as d, self.assertRaises(UserError):
            MetricsWriter(Path(d, "metrics.jsonl"), report_to=("swanlab",))

    def test_wandb_missing_is_one_line(self):
        with mock.patch.dict(sys.modules, {"wandb": None}):      # import wandb raises ImportError
            with self.assertRaises(UserError) as ctx:
                parse_report_to("tensorboard,wandb")
            self.assertEqual(str(ctx.exception), "--report-to wandb: wandb is not installed (pip install wandb)")
            with tempfile.TemporaryDirectory() as d, self.assertRaises(UserError):
                MetricsWriter(Path(d, "metrics.jsonl"), report_to="wandb")

    def test_wandb_stand_in_gets_init_config_log_finish(self):
        calls = []
        run = types.SimpleNamespace(
            config=types.SimpleNamespace(update=lambda cfg, allow_val_change: calls.append(("config", cfg))),
            log=lambda values, step: calls.append(("log", step, values)),
            finish=lambda: calls.append(("finish",)))
        fake = types.ModuleType("wandb")
        fake.init = lambda **kw: calls.append(("init", kw)) or run
        env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
        with tempfile.TemporaryDirectory() as d, mock.patch.dict(sys.modules, {"wandb": fake}), \
                mock.patch.dict(os.environ, env, clear=True):
            with MetricsWriter(Path(d, "grpo", "metrics.jsonl"), report_to="wandb", run_name="grpo-a") as w:
                for record in RECORDS[:3]:
                    w.write(record)
            self.assertEqual(calls[0], ("init", {"project": "wordle-mlx", "name": "grpo-a", "mode": "offline",
                                                 "dir": str(Path(d, "grpo"))}))
        self.assertEqual(calls[1][0], "config")
        self.assertEqual(calls[1][1]["config"], {"rl": {"lr": 0.02}})
        self.assertEqual(calls[2], ("log", 0, {"valid/win_rate": 0.25}))
        self.assertEqual(calls[3][:2], ("log", 1))
        self.assertNotIn("train/kl", calls[3][2])
        self.assertEqual(calls[-1], ("finish",))

    def test_null_writer_takes_the_same_arguments(self):
        with NullWriter("unused/metrics.jsonl", report_to=("tensorboard",), run_name="x") as w:
            w.write(RECORDS[1])
        self.assertFalse(Path("unused").exists())


if __name__ == "__main__":
    unittest.main()

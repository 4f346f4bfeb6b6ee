"""Artifacts record no absolute paths when the user gave relative ones, so a project folder can move.

From a temp working folder with relative paths: `data` -> `sft` (1 step) -> `train` (1 step) -> `eval` (2
games) -> `plot`, in process through the CLI. No JSON file written (stats.json, the run folders' config.json,
metrics.jsonl, adapter_config.json, trainer state, the eval JSON) and no command's output names the temp
folder. The run folders' config.json store their paths relative to the run folder, which is what `--resume`
resolves them against: after the whole folder is moved elsewhere, `sft --resume` and `train --resume` continue
from the copied configs there. Also the two path helpers of config.py on their own.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unittest
from pathlib import Path

from typer.testing import CliRunner

from wordle_mlx.cli import app
from wordle_mlx.config import config_relative_path, display_path

ROOT = Path(__file__).resolve().parents[1]
TINY = "builtin:tiny-random"


def in_folder(folder: Path, *args: str):
    """`wordle-mlx ARGS` run in `folder` (the working folder is restored after)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        return CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        os.chdir(before)


def written_json(folder: Path) -> dict[str, str]:
    """Every .json / .jsonl file below `folder`, by relative path, as text."""
    return {str(p.relative_to(folder)): p.read_text(encoding="utf-8")
            for p in sorted(folder.rglob("*")) if p.suffix in (".json", ".jsonl") and p.is_file()}


class HelperTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name).resolve()
        self.before = os.getcwd()
        os.chdir(self.root)

    def tearDown(self):
        os.chdir(self.before)
        self.tmp.cleanup()

    def test_display_path(self):
        self.assertEqual(display_path("logs/run"), "logs/run")
        self.assertEqual(display_path(self.root / "logs" / "run"), "logs/run")   # absolute inside: relative
        self.assertEqual(display_path(self.root), ".")
        outside = self.root.parent / "elsewhere"
        self.assertEqual(display_path(outside), str(outside))                    # outside: as given
        for spec in ("builtin:tiny-random", "mlx-community/gemma-3-270m-it-bf16"):   # specs pass unchanged
            self.assertEqual(display_path(spec), spec)

    def test_config_relative_path(self):
        self.assertEqual(config_relative_path("data/sft", "logs/sft"), "../../data/sft")
        self.assertEqual(config_relative_path(self.root / "logs", self.root / "logs" / "grpo"), "..")
        self.assertEqual(config_relative_path("logs/sft/adapters", "logs/grpo"), "../sft/adapters")
        outside = self.root.parent / "elsewhere"
        self.assertEqual(config_relative_path(outside, "logs/sft"), str(outside))  # outside the project: absolute

    def test_messages_name_relative_paths(self):
        result = CliRunner().invoke(app, ["sft", "--model", TINY, "--no-progress"])   # no data/sft here
        self.assertEqual(result.exit_code, 2, result.output)
        self.assertIn("data/sft/train.jsonl: file not found", result.output)
        self.assertNotIn(str(self.root), result.output)


class MovableProjectTest(unittest.TestCase):
    """One chain in a temp folder, then the folder moved and both runs resumed there."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.top = Path(cls.tmp.name)
        cls.first = cls.top / "first"
        cls.first.mkdir()
        cls.outputs = {}
        steps = [
            ("data", "data", "--train-examples", "16", "--valid-examples", "4", "--no-progress", "--json"),
            ("sft", "sft", "--model", TINY, "--steps", "1", "--no-progress", "--json"),
            ("train", "train", "--model", TINY, "--steps", "1", "--no-progress", "--json"),
            ("eval", "eval", "--model", TINY, "--adapter", "logs/grpo/adapters", "--games", "2", "--no-baselines",
             "--out", "results/eval.json", "--no-progress", "--json"),
            ("plot", "plot", "--file", "logs/sft/metrics.jsonl", "--json"),
        ]
        for name, *args in steps:
            result = in_folder(cls.first, *args)
            assert result.exit_code == 0, f"{name}: {result.output[-2000:]}"
            cls.outputs[name] = result.output
        cls.files = written_json(cls.first)
        cls.second = cls.top / "second"                 # the whole project moved: no path may point back
        shutil.move(str(cls.first), str(cls.second))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def absolute_forms(self) -> set[str]:
        return {str(self.top), str(self.top.resolve()), str(ROOT)}

    def test_written_json_names_no_absolute_folder(self):
        for expected in ("data/sft/stats.json", "logs/sft/config.json", "logs/grpo/config.json",
                         "logs/sft/metrics.jsonl", "logs/grpo/metrics.jsonl", "logs/sft/adapters/adapter_config.json",
                         "logs/grpo/adapters/adapter_config.json", "results/eval.json"):
            self.assertIn(expected, self.files)
        for name, text in self.files.items():
            for absolute in self.absolute_forms():
                self.assertNotIn(absolute, text, f"{name} records {absolute}")

    def test_command_output_names_no_absolute_folder(self):
        for name, text in self.outputs.items():
            for absolute in self.absolute_forms():
                self.assertNotIn(absolute, text, f"{name}'s output names {absolute}")
        self.assertIn('"adapter": "logs/grpo/adapters"', self.files["results/eval.json"])
        self.assertEqual(json.loads(self.outputs["data"])["out"], "data/sft")

    def test_run_configs_are_relative_to_the_run_folder(self):
        sft = json.loads(self.files["logs/sft/config.json"])
        self.assertEqual((sft["data"]["folder"], sft["run"]["logs_dir"], sft["model"]["name"]),
                         ("../../data/sft", "..", TINY))
        grpo = json.loads(self.files["logs/grpo/config.json"])
        self.assertEqual((grpo["model"]["adapter"], grpo["run"]["logs_dir"], grpo["model"]["name"]),
                         ("../sft/adapters", "..", TINY))

    def test_resume_from_the_copied_config_after_a_move(self):
        for command, run in (("sft", "logs/sft"), ("train", "logs/grpo")):
            result = in_folder(self.second, command, "--resume", run, "--steps", "2", "--no-progress", "--json")
            self.assertEqual(result.exit_code, 0, f"{command} --resume: {result.output[-2000:]}")
            for absolute in self.absolute_forms():
                self.assertNotIn(absolute, result.output)
            steps = [json.loads(line) for line in (self.second / run / "metrics.jsonl").read_text().splitlines()]
            self.assertEqual([r["step"] for r in steps if r["kind"] in ("sft", "train")], [1, 2])


if __name__ == "__main__":
    unittest.main()

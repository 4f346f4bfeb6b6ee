"""Foundation commands through the CLI: doctor's JSON schema, entropy and solve output, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from typer.testing import CliRunner

from wordle_mlx.cli import app
from wordle_mlx.config import StrictModel, load_config
from wordle_mlx.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


class DoctorTest(unittest.TestCase):
    def test_json_schema(self):
        result = CliRunner().invoke(app, ["doctor", "--json", "--size", "256"])
        self.assertEqual(result.exit_code, 0, result.output)
        data = json.loads(result.stdout)
        for key in ("platform", "mlx_version", "mlx_lm_version", "device", "blas", "glibc_tunables", "mlx_gflops",
                    "numpy_gflops"):
            self.assertIn(key, data)
        self.assertGreater(data["mlx_gflops"], 0)
        self.assertGreater(data["numpy_gflops"], 0)
        self.assertTrue(data["mlx_lm_version"].startswith("0.32."))


class EntropySolveCliTest(unittest.TestCase):
    def test_entropy_json_top(self):
        result = CliRunner().invoke(app, ["entropy", "--json", "--top", "3"])
        self.assertEqual(result.exit_code, 0, result.output)
        data = json.loads(result.stdout)
        self.assertEqual([r["word"] for r in data["top"]], ["soare", "roate", "raise"])
        self.assertAlmostEqual(data["top"][0]["bits"], 5.886, places=3)
        self.assertIn("seconds", data)

    def test_solve_one_word(self):
        result = CliRunner().invoke(app, ["solve", "--word", "abbey", "--json"])
        self.assertEqual(result.exit_code, 0, result.output)
        data = json.loads(result.stdout)
        self.assertTrue(data["won"])
        self.assertEqual(data["guesses"][-1], "abbey")

    def test_bad_word_is_one_line_exit_2(self):
        for word, needle in (("abc", "letters"), ("zzzzz", "not in the answer list"), ("ab1de", "a-z")):
            proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "solve", "--word", word],
                                  capture_output=True, text=True, cwd=ROOT, env={**os.environ, "WORDLE_MLX_NO_REEXEC": "1"})
            self.assertEqual(proc.returncode, 2, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, proc.stderr)
            self.assertIn(needle, lines[0])
            self.assertNotIn("Traceback", proc.stderr)

    def test_bad_word_list_file_names_line(self):
        with tempfile.TemporaryDirectory() as d:
            bad = Path(d, "mine.txt")
            bad.write_text("crane\nslate\nCR-NE\n")
            proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "entropy", "--answers-list", str(bad)],
                                  capture_output=True, text=True, cwd=ROOT, env={**os.environ, "WORDLE_MLX_NO_REEXEC": "1"})
            self.assertEqual(proc.returncode, 2)
            self.assertIn("mine.txt:3", proc.stderr)


class ConfigLoaderTest(unittest.TestCase):
    class Inner(StrictModel):
        rank: int = 8

    class Outer(StrictModel):
        name: str = "x"
        lora: "ConfigLoaderTest.Inner" = None  # type: ignore[assignment]

    def _load(self, text: str):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d, "cfg.json")
            path.write_text(text)
            return load_config(path, self.Outer)

    def test_errors_name_file_field_value(self):
        self.Outer.model_rebuild()
        cases = {
            '{"lora": {"rank": "big"}}': ("cfg.json", "lora.rank", "'big'"),
            '{"lora": {"rnak": 4}}': ("cfg.json", "lora.rnak", "unknown field"),
            '{"name": "a",}': ("cfg.json:1", "invalid JSON"),
            "": ("cfg.json", "empty"),
            "[1, 2]": ("cfg.json", "JSON object"),
        }
        for text, needles in cases.items():
            with self.assertRaises(UserError, msg=text) as ctx:
                self._load(text)
            message = str(ctx.exception)
            self.assertNotIn("\n", message)
            for needle in needles:
                self.assertIn(needle, message, (text, message))

    def test_missing_file(self):
        with self.assertRaises(UserError) as ctx:
            load_config("/no/such/config.json", self.Outer)
        self.assertIn("/no/such/config.json", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()

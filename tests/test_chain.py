"""From an empty folder, the commands chain through their default paths (as the README shows): `data` writes
data/sft, `sft` (no config) reads it and writes logs/sft, `train` (no config) starts from logs/sft/adapters and
writes logs/grpo, and `eval --adapter logs/grpo/adapters` plays with it. Size flags keep it short; the tiny
random model stands in for Gemma. Each command runs as its own process in the folder, with this checkout's
code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = "builtin:tiny-random"


class DefaultPathsChainTest(unittest.TestCase):
    def wordle_mlx(self, folder: Path, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-m", "wordle_mlx", *args], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=1200)
        self.assertEqual(proc.returncode, 0, f"wordle-mlx {' '.join(args)}:\n{proc.stderr[-2000:]}")
        return proc

    def test_data_sft_train_eval_from_an_empty_folder(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            self.wordle_mlx(folder, "data", "--train-examples", "16", "--valid-examples", "4", "--no-progress")
            self.assertTrue((folder / "data" / "sft" / "train.jsonl").is_file())
            stats = json.loads((folder / "data" / "sft" / "stats.json").read_text())
            self.assertEqual((stats["prompt"]["style"], stats["prompt"]["guess_format"]), ("compact", "letters"))

            self.wordle_mlx(folder, "sft", "--model", TINY, "--steps", "2", "--no-progress")
            adapter = json.loads((folder / "logs" / "sft" / "adapters" / "adapter_config.json").read_text())
            self.assertEqual(adapter["wordle_prompt"], stats["prompt"])     # the data's prompt goes with it

            self.wordle_mlx(folder, "train", "--model", TINY, "--steps", "1", "--no-progress")
            saved = json.loads((folder / "logs" / "grpo" / "config.json").read_text())
            # stored relative to the run folder (what --resume resolves it against), so the folder can move
            self.assertEqual(saved["model"]["adapter"], "../sft/adapters")
            self.assertEqual(saved["run"]["logs_dir"], "..")
            self.assertEqual(saved["optimizer"]["name"], "sgd")

            out = self.wordle_mlx(folder, "eval", "--model", TINY, "--adapter", "logs/grpo/adapters", "--games", "2",
                                  "--no-baselines", "--no-progress", "--json")
            result = json.loads(out.stdout)
            self.assertEqual((result["games"], result["max_tokens_per_turn"]), (2, 16))   # letters: 16 tokens


if __name__ == "__main__":
    unittest.main()

"""Data-parallel SFT and GRPO: 2 ranks on localhost under `mlx.launch --backend ring`, tiny model.

Checks that the CLI runs unchanged under mlx.launch, that both ranks end with bitwise-equal LoRA weights
(each rank writes a hash through WORDLE_MLX_WEIGHTS_HASH_DIR) equal to rank 0's saved adapters, that the
metrics count every rank's games, that resuming with another number of ranks is refused, that a dead rank
stops the group, and (tests/distributed_check.py) that the gradient summed over 2 ranks equals the one-process
gradient on the whole batch for the GRPO and SFT losses. Every launch has a timeout, so a hang fails the test.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx

from wordle_mlx.config import validate_config
from wordle_mlx.game.splits import split_words
from wordle_mlx.llm.training.distributed import HASH_DIR_ENV, TIMEOUT_ENV, arrays_hash
from wordle_mlx.storage.metrics import read_jsonl, record_kind
from wordle_mlx.stages import data

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 240


def free_ports(n: int = 2) -> int:
    """A starting port p such that p .. p + n - 1 are free now (mlx.launch's ring uses one port per rank)."""
    for _ in range(50):
        start = random.randrange(30000, 60000 - n)
        try:
            socks = []
            for port in range(start, start + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return start
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


def launch(command: list[str], env: dict | None = None, ranks: int = 2) -> subprocess.CompletedProcess:
    """`mlx.launch -n ranks --backend ring -- command` on localhost. Note: mlx.launch exits 0 even when a rank
    failed, so callers check the ranks' outputs rather than the return code."""
    args = [str(BIN / "mlx.launch"), "-n", str(ranks), "--backend", "ring", "-p", str(free_ports(ranks)),
            "--", *command]
    return subprocess.run(args, cwd=REPO, env={**os.environ, TIMEOUT_ENV: "300", **(env or {})},
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, stdin=subprocess.DEVNULL)


def records(run_dir: Path, kind: str) -> list[dict]:
    """The run's records of `kind` (SFT's old kinds read as today's: `record_kind`)."""
    return [r for _, r in read_jsonl(run_dir / "metrics.jsonl") if record_kind(r) == kind]


class DistributedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def assert_same_weights(self, stage: str, hashes: Path, adapters: Path, out) -> None:
        files = sorted(hashes.glob(f"{stage}-rank*.sha256"))
        self.assertEqual([f.name for f in files], [f"{stage}-rank0.sha256", f"{stage}-rank1.sha256"],
                         out.stdout + out.stderr)
        rank0, rank1 = (f.read_text().strip() for f in files)
        self.assertEqual(rank0, rank1)
        self.assertEqual(arrays_hash(mx.load(str(adapters / "adapters.safetensors"))), rank0)

    def test_gradients_match_one_process(self):
        out_dir = self.root / "grad"
        out_dir.mkdir()
        for mode in ("grpo", "sft"):
            out = launch([sys.executable, str(REPO / "tests" / "distributed_check.py"), str(out_dir), mode])
            for rank in (0, 1):
                path = out_dir / f"{mode}-rank{rank}.json"
                self.assertTrue(path.is_file(), out.stdout + out.stderr)
                res = json.loads(path.read_text())
                self.assertEqual(res["size"], 2)
                for check in [res]:
                    self.assertGreater(check["max_grad"], 1e-3)
                    self.assertLess(check["max_diff"], 1e-5 * check["max_grad"] + 1e-7, f"{mode}: {check}")
                    for key, value in check["single"].items():
                        self.assertAlmostEqual(check["distributed"][key], value, delta=1e-5 * max(1.0, abs(value)))
            if mode == "grpo":
                self.assertEqual(res["local_items"], 6)                 # 4 groups of 3, split by group
            else:
                self.assertEqual(json.loads((out_dir / "sft-rank1.json").read_text())["local_batches"], 2)

    def test_a_dead_rank_stops_the_others(self):
        out_dir = self.root / "die"
        out_dir.mkdir()
        out = launch([sys.executable, str(REPO / "tests" / "distributed_check.py"), str(out_dir), "die"])
        self.assertFalse((out_dir / "die-rank0.json").exists())
        text = out.stdout + out.stderr
        # Either the launcher saw rank 1's exit first and stopped rank 0, or rank 0 noticed the lost peer
        # first and stopped with its own one-line reason; both mean the group did not hang.
        self.assertTrue("rank 1 exited with code 7" in text or "another rank probably stopped" in text, text)

    def test_grpo_train(self):
        cfg = {"model": {"name": "builtin:tiny-random", "adapter": None}, "lora": {"rank": 4, "scale": 10.0},
               "optimizer": {"name": "adamw", "min_lr_ratio": 0.0, "learning_rate": 1e-3},
               "run": {"steps": 3, "save_every": 2, "seed": 3, "logs_dir": str(self.root / "logs"), "name": "grpo2"},
               "rl": {"batch_prompts": 2, "num_generations": 3}, "max_tokens": 8, "decode": "free",
               "reward": {"early": 1.2}, "validation": {"every": 3, "games": 3}}
        config = self.root / "grpo.json"
        config.write_text(json.dumps(cfg))
        hashes = self.root / "hash-grpo"
        out = launch([str(BIN / "wordle-mlx"), "train", "--config", str(config), "--no-progress"],
                     env={HASH_DIR_ENV: str(hashes)})
        run_dir = self.root / "logs" / "grpo2"
        self.assertTrue((run_dir / "adapters" / "adapters.safetensors").is_file(), out.stdout + out.stderr)
        self.assert_same_weights("grpo", hashes, run_dir / "adapters", out)
        self.assertEqual(records(run_dir, "run")[0]["world_size"], 2)
        train = records(run_dir, "train")
        self.assertEqual([r["step"] for r in train], [1, 2, 3])
        for r in train:
            self.assertEqual(len(r["games"]), 2)                      # B games over both ranks
            self.assertEqual(len({g["secret"] for g in r["games"]}), 2)   # rank 0 and rank 1 played different prompts
        start, valid = records(run_dir, "valid")                       # the start adapter (step 0), then step 3
        self.assertEqual((start["step"], valid["step"]), (0, 3))
        for rec in (start, valid):
            self.assertEqual([g["secret"] for g in rec["games"]], split_words("valid")[:3])
        state = json.loads((run_dir / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
        self.assertEqual(state["world_size"], 2)
        # resuming with one process is refused with a clear message
        res = subprocess.run([str(BIN / "wordle-mlx"), "train", "--resume", str(run_dir), "--steps", "4"],
                             capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, cwd=REPO)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("trained with 2 rank(s) but is resumed with 1", res.stderr)

    def test_sft(self):
        cfg = validate_config({"out": str(self.root / "data"), "train_examples": 8, "valid_examples": 4,
                               "think_style": "brief", "progress": False}, data.DataConfig, "test")
        data.run(cfg)
        config = self.root / "sft.json"
        sft_config = {
            "model": {"name": "builtin:tiny-random"}, "data": {"folder": str(self.root / "data"), "batch_size": 4},
            "run": {"logs_dir": str(self.root / "logs"), "name": "sft2", "steps": 3, "save_every": 3},
            "optimizer": {"learning_rate": 1e-2, "warmup_steps": 1}, "lora": {"rank": 4}, "max_tokens": 8,
            "validation": {"every": 3, "games": 3}}
        config.write_text(json.dumps(sft_config))
        hashes = self.root / "hash-sft"
        out = launch([str(BIN / "wordle-mlx"), "sft", "--config", str(config), "--no-progress"],
                     env={HASH_DIR_ENV: str(hashes)})
        run_dir = self.root / "logs" / "sft2"
        self.assertTrue((run_dir / "adapters" / "adapters.safetensors").is_file(), out.stdout + out.stderr)
        self.assert_same_weights("sft", hashes, run_dir / "adapters", out)
        steps = records(run_dir, "train")
        self.assertEqual([r["step"] for r in steps], [1, 2, 3])
        valid, = records(run_dir, "valid")
        self.assertEqual([g["secret"] for g in valid["games"]], split_words("valid")[:3])
        self.assertGreater(valid["val_loss"], 0)
        # batch size 3 cannot be split over 2 ranks
        config.write_text(json.dumps({**sft_config, "data": {**sft_config["data"], "batch_size": 3}}))
        out = launch([str(BIN / "wordle-mlx"), "sft", "--config", str(config), "--no-progress", "--run-name", "odd"])
        self.assertIn("data.batch_size = 3 must be divisible by the number of ranks (2)", out.stderr)


if __name__ == "__main__":
    unittest.main()

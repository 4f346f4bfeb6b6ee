"""Faults: kill -9 and resume, a disk that fills during a checkpoint, corrupt checkpoints, adapters and caches.

The kill tests run the real CLI as subprocesses on the tiny model (the trials of
benchmarks/fault_injection.py, 3 per command here instead of 20): a run is killed with SIGKILL at a random
moment or inside a checkpoint write (the WORDLE_MLX_FAULT test hook), resumed, and must end with every
step logged once and the same losses and final adapter, bitwise, as an uninterrupted run. Whatever the
kill timing, the checks are the same, so the outcome does not depend on it. The other tests run in
process: write failures are injected by patching the writers, corrupt files are made by truncating them.
"""

from __future__ import annotations

import errno
import io
import json
import os
import random
import shutil
import signal
import tempfile
import unittest
from contextlib import redirect_stderr
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
from typer.testing import CliRunner

from benchmarks import fault_injection as fi
from wordle_mlx.storage import metrics
from wordle_mlx.cli import app
from wordle_mlx.errors import UserError
from wordle_mlx.game.entropy import PatternTable
from wordle_mlx.llm.model import lora
from wordle_mlx.llm.model.models import load_model
from wordle_mlx.storage.metrics import read_jsonl

KILLS_PER_COMMAND = 3


def invoke(args: list[str]):
    return CliRunner().invoke(app, args, catch_exceptions=True)


def assert_one_line_error(test: unittest.TestCase, result, *fragments: str) -> str:
    """Exit code 2, one stderr line starting `error:`, no traceback, naming every fragment."""
    test.assertIsNone(result.exception if not isinstance(result.exception, SystemExit) else None,
                      f"uncaught {result.exception!r}")
    test.assertEqual(result.exit_code, 2, result.output)
    lines = result.stderr.strip().splitlines()
    test.assertEqual(len(lines), 1, result.stderr)
    test.assertTrue(lines[0].startswith("error: "), lines[0])
    test.assertNotIn("Traceback", result.stderr)
    for fragment in fragments:
        test.assertIn(fragment, lines[0])
    return lines[0]


_WORKSPACE: dict = {}


def setUpModule():
    _WORKSPACE["tmp"] = tempfile.TemporaryDirectory()
    _WORKSPACE["path"] = fi.make_workspace(Path(_WORKSPACE["tmp"].name) / "ws")


def tearDownModule():
    _WORKSPACE["tmp"].cleanup()


class Workspace(unittest.TestCase):
    """Tiny configs and SFT data in a temp folder (one `wordle-mlx data` run), shared by the whole module."""

    @classmethod
    def setUpClass(cls):
        cls.ws = _WORKSPACE["path"]

    def config(self, name: str, **changes) -> Path:
        """A copy of the workspace config `name` with `changes` (dotted: section.field), written beside it."""
        cfg = json.loads((self.ws / name).read_text())
        for key, value in changes.items():
            section, _, field = key.partition(".")
            if field:
                cfg[section][field] = value
            else:
                cfg[key] = value
        path = self.ws / f"{self.id().rsplit('.', 1)[-1]}-{name}"
        path.write_text(json.dumps(cfg))
        return path


def reference(stage: str) -> fi.Reference:
    """The uninterrupted run of `stage` ("sft" or "train") in the workspace, run once per module."""
    if stage not in _WORKSPACE:
        _WORKSPACE[stage] = fi.reference_run(_WORKSPACE["path"], stage)
    return _WORKSPACE[stage]


class KillAndResume(Workspace):
    def kill_trials(self, stage: str) -> None:
        ref = reference(stage)
        rng = random.Random(1234)
        trials = [fi.run_trial(self.ws, stage, ref, rng, use_hook=(i % 3 == 2)) for i in range(KILLS_PER_COMMAND)]
        for t in trials:
            self.assertTrue(t.survived, f"{stage} {t.how}: {t.problems}")
        hooked = [t for t in trials if t.how.startswith("checkpoint-write")]
        self.assertTrue(hooked and all(t.killed for t in hooked))     # the hook really killed mid-write

    def test_sft_killed_then_resumed_equals_uninterrupted(self):
        self.kill_trials("sft")

    def test_train_killed_then_resumed_equals_uninterrupted(self):
        self.kill_trials("train")


class StopSignalThenResume(Workspace):
    """SIGTERM in the middle of a step: the run finishes that step, saves a checkpoint there, exits 143 with a
    one-line note naming the step and the --resume command; the resumed run equals the uninterrupted one."""

    def signal_during_call(self, target, name: str, call: int):
        real = getattr(target, name)
        calls = {"n": 0}

        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == call:
                os.kill(os.getpid(), signal.SIGTERM)       # delivered here, in the middle of the step
            return real(*args, **kwargs)
        return mock.patch.object(target, name, wrapped)

    def check(self, stage: str, target, name: str, run_name: str, cfg_name: str) -> None:
        cmd, _, kind, total_steps, _ = fi.STAGES[stage]
        # the uninterrupted run in this process too, so that both use the same BLAS
        done = invoke([cmd, "--config", str(self.config(cfg_name, **{"run.name": f"{run_name}-ref"})), "--no-progress"])
        self.assertEqual(done.exit_code, 0, done.stderr)
        ref_dir = self.ws / "logs" / f"{run_name}-ref"
        ref = fi.Reference(fi.adapter_tensors(ref_dir / "adapters"),
                           {r["step"]: (r["loss"], r["grad_norm"]) for r in fi.step_records(ref_dir, kind)}, 0.0)
        cfg = self.config(cfg_name, **{"run.name": run_name})
        with self.signal_during_call(target, name, 3):
            result = invoke([cmd, "--config", str(cfg), "--no-progress"])
        run_dir = self.ws / "logs" / run_name
        self.assertEqual(result.exit_code, 143, result.output)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn(f"stopped by SIGTERM at step 3: checkpoint saved; continue with --resume {run_dir}",
                      result.stderr)
        self.assertEqual([r["step"] for r in fi.step_records(run_dir, kind)], [1, 2, 3])
        self.assertEqual(lora.latest_checkpoint(run_dir / "checkpoints").name, "step_000003")
        self.assertEqual(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)    # the handler was removed
        done = invoke([cmd, "--resume", str(run_dir), "--no-progress"])
        self.assertEqual(done.exit_code, 0, done.stderr)
        trial = fi.Trial(stage, "SIGTERM", resumed_from=3)
        fi.check_finished_run(run_dir, kind, total_steps, ref, trial)
        self.assertEqual(trial.problems, [])

    def test_sft_sigterm_then_resume_equals_uninterrupted(self):
        from wordle_mlx.llm.training import trainer
        self.check("sft", trainer, "accumulate_gradients", "sigterm-sft", "sft.json")

    def test_train_sigterm_then_resume_equals_uninterrupted(self):
        from wordle_mlx.llm.training import rl
        self.check("train", rl, "policy_batch", "sigterm-grpo", "grpo.json")


class DiskFull(Workspace):
    """A write that fails during a checkpoint: the previous checkpoint survives, the error names the path."""

    def failing_save(self, fail_at_call: int, error: Exception):
        real = lora.mx.save_safetensors
        calls = {"n": 0}

        def save(path, arrays, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == fail_at_call:
                with open(path, "wb") as fh:           # a partial file, as a full disk leaves it
                    fh.write(b"\0" * 100)
                raise error
            return real(path, arrays, *args, **kwargs)
        return mock.patch.object(lora.mx, "save_safetensors", save)

    def check_previous_checkpoint(self, run_dir: Path, step: int) -> None:
        checkpoints = run_dir / "checkpoints"
        self.assertEqual(lora.latest_checkpoint(checkpoints).name, f"step_{step:06d}")
        self.assertEqual(sorted(p.name for p in checkpoints.iterdir()), ["latest", f"step_{step:06d}"])
        state = json.loads((checkpoints / f"step_{step:06d}" / "trainer_state.json").read_text())
        self.assertEqual(state["step"], step)

    def test_sft_enospc_in_second_checkpoint(self):
        cfg = self.config("sft.json", **{"run.name": "full-sft"})
        # two safetensors files per checkpoint: call 3 is the second checkpoint's adapters
        with self.failing_save(3, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))):
            result = invoke(["sft", "--config", str(cfg), "--no-progress"])
        run_dir = self.ws / "logs" / "full-sft"
        assert_one_line_error(self, result, str(run_dir / "checkpoints" / "step_000004"), "No space left on device")
        self.check_previous_checkpoint(run_dir, 2)
        done = invoke(["sft", "--resume", str(run_dir), "--no-progress"])      # space is back: resume finishes
        self.assertEqual(done.exit_code, 0, done.stderr)
        steps = [r["step"] for _, r in read_jsonl(run_dir / "metrics.jsonl") if metrics.record_kind(r) == "train"]
        self.assertEqual(steps, list(range(1, fi.SFT_STEPS + 1)))

    def test_train_mlx_write_error_in_second_checkpoint(self):
        cfg = self.config("grpo.json", **{"run.name": "full-grpo"})
        # MLX reports a full disk as RuntimeError("[write] Unable to write N bytes to file."); call 4 is the
        # second checkpoint's optimizer state, after its adapters were written
        with self.failing_save(4, RuntimeError("[write] Unable to write 8 bytes to file.")):
            result = invoke(["train", "--config", str(cfg), "--no-progress"])
        run_dir = self.ws / "logs" / "full-grpo"
        assert_one_line_error(self, result, str(run_dir / "checkpoints" / "step_000004"), "Unable to write")
        self.check_previous_checkpoint(run_dir, 2)

    def test_metrics_write_enospc(self):
        cfg = self.config("sft.json", **{"run.name": "full-metrics"})
        calls = {"n": 0}

        def fsync(fd):             # the metrics writer's fsync only: the 4th record (step 3) hits a full disk
            calls["n"] += 1
            if calls["n"] == 4:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return os.fsync(fd)

        with mock.patch.object(metrics, "os", SimpleNamespace(fsync=fsync)):
            result = invoke(["sft", "--config", str(cfg), "--no-progress"])
        assert_one_line_error(self, result, str(self.ws / "logs" / "full-metrics" / "metrics.jsonl"),
                              "No space left on device")


class CorruptFiles(Workspace):
    """Truncated or garbled checkpoint, adapter and cache files give a one-line error naming the file."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        result = invoke(["sft", "--config", str(cls.ws / "sft.json"), "--no-progress"])
        assert result.exit_code == 0, result.stderr
        cls.run_dir = cls.ws / "logs" / "sft"

    def damaged_copy(self, relative: str, damage) -> Path:
        copy = self.ws / "logs" / f"damaged-{self.id().rsplit('.', 1)[-1]}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(self.run_dir, copy)
        target = copy / relative
        damage(target)
        return copy

    @staticmethod
    def truncate(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])

    def resume_fails_naming(self, relative: str, damage=None) -> None:
        copy = self.damaged_copy(relative, damage or self.truncate)
        result = invoke(["sft", "--resume", str(copy), "--no-progress"])
        assert_one_line_error(self, result, str(copy / relative))

    def test_truncated_checkpoint_adapters(self):
        self.resume_fails_naming("checkpoints/step_000008/adapters.safetensors")

    def test_garbage_optimizer_state(self):
        self.resume_fails_naming("checkpoints/step_000008/optimizer.safetensors",
                                 lambda p: p.write_bytes(b"\x10" + b"\0" * 7 + b"{not json}" + b"x" * 50))

    def test_truncated_trainer_state(self):
        self.resume_fails_naming("checkpoints/step_000008/trainer_state.json")

    def test_garbage_latest_pointer_falls_back_to_newest_complete_checkpoint(self):
        copy = self.damaged_copy("checkpoints/latest", lambda p: p.write_bytes(b"\xff\xfe../../etc\n"))
        self.assertEqual(lora.latest_checkpoint(copy / "checkpoints").name, "step_000008")

    def test_truncated_adapter_for_eval(self):
        adapter = self.damaged_copy("adapters/adapters.safetensors", self.truncate) / "adapters"
        result = invoke(["eval", "--model", "builtin:tiny-random", "--adapter", str(adapter), "--games", "1",
                         "--no-baselines", "--max-tokens", "4"])
        assert_one_line_error(self, result, str(adapter / "adapters.safetensors"))

    def test_garbled_adapter_config(self):
        adapter = self.damaged_copy("adapters/adapter_config.json", self.truncate) / "adapters"
        with self.assertRaises(UserError) as ctx:
            load_model("builtin:tiny-random", adapter_path=adapter)
        self.assertIn(str(adapter / "adapter_config.json"), str(ctx.exception))

    def test_truncated_cached_model(self):
        with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"WORDLE_MLX_CACHE": cache}):
            load_model("builtin:tiny-random")                       # builds the tiny model in this cache
            folder = Path(cache, "models", "tiny-random-seed0")
            self.truncate(next(folder.glob("model*.safetensors")))
            with self.assertRaises(UserError) as ctx:
                load_model("builtin:tiny-random")
            self.assertIn(str(folder), str(ctx.exception))
            self.assertIn("delete the folder", str(ctx.exception))
            self.assertNotIn("\n", str(ctx.exception))


class OverwriteIsAllOrNothing(unittest.TestCase):
    def test_crash_while_deleting_an_old_run_leaves_no_half_run(self):
        """--overwrite removes the old run with fileio.remove_tree: renamed aside first, so never half there."""
        from wordle_mlx.storage import fileio
        with tempfile.TemporaryDirectory() as d:
            run = Path(d, "run")
            (run / "checkpoints" / "step_000002").mkdir(parents=True)
            (run / "metrics.jsonl").write_text("{}\n")
            with mock.patch.object(fileio.shutil, "rmtree", side_effect=KeyboardInterrupt):
                with self.assertRaises(KeyboardInterrupt):
                    fileio.remove_tree(run)
            self.assertFalse(run.exists())
            (trash,) = Path(d).iterdir()
            self.assertTrue((trash / "checkpoints" / "step_000002").is_dir())


class PatternCache(unittest.TestCase):
    """A stale or corrupt entropy cache is rebuilt with a note, and the rebuilt table is right."""

    guesses = ("crane", "slate", "pious", "brine", "abbey", "xylyl")
    answers = ("crane", "pious", "brine", "abbey")

    def cached(self, folder: Path) -> tuple[PatternTable, str]:
        err = io.StringIO()
        with redirect_stderr(err):
            table = PatternTable.cached(self.guesses, self.answers, folder=folder)
        return table, err.getvalue()

    def test_corrupt_and_stale_cache_rebuilt_with_note(self):
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d)
            expected = PatternTable.build(self.guesses, self.answers).matrix
            table, note = self.cached(folder)
            self.assertEqual(note, "")
            (path,) = folder.glob("patterns-*.npz")
            path.write_bytes(path.read_bytes()[:50])                          # truncated
            table, note = self.cached(folder)
            self.assertIn(f"note: pattern cache {path} is unreadable", note)
            np.testing.assert_array_equal(table.matrix, expected)
            np.savez(open(path, "wb"), matrix=np.zeros((2, 2), np.uint8),     # stale: other lists
                     guesses=np.array("a"), answers=np.array("b"))
            table, note = self.cached(folder)
            self.assertIn("does not match the word lists; rebuilding", note)
            np.testing.assert_array_equal(table.matrix, expected)
            table, note = self.cached(folder)                                  # the rebuilt file is good
            self.assertEqual(note, "")


if __name__ == "__main__":
    unittest.main()

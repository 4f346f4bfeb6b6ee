"""Fault injection: `kill -9` of `wordle-mlx sft` and `wordle-mlx train` at random points, then `--resume`.

Runs the real CLI as subprocesses on the tiny random model with tiny configs in a temp folder. First one
uninterrupted reference run per command; then, per trial, a run killed with SIGKILL either at a random
moment of its training loop or (every third trial) inside a checkpoint write through the test hook
`WORDLE_MLX_FAULT=checkpoint-write:N` (llm/model/lora.py), followed by `--resume` to the end (or, when no
checkpoint was complete yet, a clean one-line refusal and a fresh run with `--overwrite`). The random
moment is picked as "after k logged steps (k uniform), plus a uniform fraction of one step", so kills
spread over the whole run however loaded the machine is. Every trial
checks: the resume started from the newest complete checkpoint on disk; the metrics JSONL holds each
step exactly once; every step's loss and grad norm and the final adapter equal the reference run's
bitwise (CPU, same seed); no traceback. With `--disk-full` (needs root for `mount -t tmpfs`) it also
fills a small tmpfs during a checkpoint and checks that the previous checkpoint survives and the error
is one line naming the path. `tests/test_faults.py` runs the same trials, fewer of them.
Last line: `survived N/M` (trials whose every check passed, of all trials).
Usage: python benchmarks/fault_injection.py [--kills 20] [--seed 0] [--disk-full] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SFT_STEPS, SFT_SAVE_EVERY = 8, 2
GRPO_STEPS, GRPO_SAVE_EVERY = 6, 2
CONFIGS = {
    "data.json": {"out": "data", "train_examples": 8, "valid_examples": 4, "think_style": "brief"},
    "sft.json": {"model": {"name": "builtin:tiny-random"}, "data": {"folder": "data", "batch_size": 2},
                 "run": {"logs_dir": "logs", "name": "sft", "steps": SFT_STEPS, "save_every": SFT_SAVE_EVERY},
                 "optimizer": {"learning_rate": 1e-2, "warmup_steps": 1}, "validation": {"every": 0},
                 "lora": {"rank": 4, "dropout": 0.1}},
    # words decoding: every reply of the random model is an allowed word, whose info gain differs from its
    # group's others, so every step has groups with a reward spread and runs a real update
    "grpo.json": {"model": {"name": "builtin:tiny-random", "adapter": None}, "lora": {"rank": 4, "scale": 10.0},
                  "optimizer": {"name": "adamw", "min_lr_ratio": 0.0, "learning_rate": 1e-3},
                  "run": {"logs_dir": "logs", "name": "grpo", "steps": GRPO_STEPS, "save_every": GRPO_SAVE_EVERY,
                          "seed": 3},
                  "rl": {"batch_prompts": 1, "num_generations": 3, "temperature": 1.0}, "decode": "words",
                  "max_tokens": 16, "reward": {"early": 1.2}, "validation": {"every": 0}},
}
# command -> (CLI subcommand, config file, metrics kind, total steps, checkpoints written by a full run: one every
# save_every steps before the last, and one at the last)
STAGES = {"sft": ("sft", "sft.json", "train", SFT_STEPS, SFT_STEPS // SFT_SAVE_EVERY),
          "train": ("train", "grpo.json", "train", GRPO_STEPS, GRPO_STEPS // GRPO_SAVE_EVERY)}


def cli_command() -> list[str]:
    script = Path(sys.executable).parent / "wordle-mlx"
    return [str(script)] if script.exists() else [sys.executable, "-m", "wordle_mlx"]


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command() + args + ["--no-progress"], cwd=cwd, env=env or os.environ.copy(),
                          capture_output=True, text=True, timeout=timeout)


def make_workspace(root: Path) -> Path:
    """Tiny configs and SFT data in `root` (one `wordle-mlx data` run)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, cfg in CONFIGS.items():
        (root / name).write_text(json.dumps(cfg, indent=1))
    done = run_cli(["data", "--config", "data.json"], root)
    if done.returncode != 0:
        raise RuntimeError(f"wordle-mlx data failed: {done.stderr}")
    return root


def step_records(run_dir: Path, kind: str) -> list[dict]:
    from wordle_mlx.storage.metrics import read_jsonl, record_kind
    return [r for _, r in read_jsonl(run_dir / "metrics.jsonl", warn=lambda m: None) if record_kind(r) == kind]


def adapter_tensors(folder: Path) -> dict:
    import numpy as np
    import mlx.core as mx
    return {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(folder / "adapters.safetensors")).items()}


def complete_checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of checkpoint folders whose last file exists (the writer renames a finished temp folder)."""
    folder = run_dir / "checkpoints"
    return sorted(int(p.name[5:]) for p in folder.glob("step_*") if (p / "trainer_state.json").is_file()) \
        if folder.is_dir() else []


@dataclass
class Reference:
    adapters: dict
    steps: dict                     # step -> (loss, grad_norm)
    train_seconds: float            # from the metrics file appearing to the process exiting


@dataclass
class Trial:
    stage: str
    how: str                        # "timer" or "checkpoint-write:N"
    killed: bool = False
    killed_after_step: int = 0      # steps logged before the kill
    resumed_from: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def survived(self) -> bool:
        return not self.problems


def reference_run(ws: Path, stage: str) -> Reference:
    cmd, cfg_file, kind, _steps, _ = STAGES[stage]
    run_dir = ws / "logs" / ("sft" if stage == "sft" else "grpo")
    proc = subprocess.Popen(cli_command() + [cmd, "--config", cfg_file, "--overwrite", "--no-progress"], cwd=ws,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = wait_for_metrics(run_dir, proc)
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"reference {stage} run failed: {err}")
    seconds = time.monotonic() - started
    ref = Reference(adapter_tensors(run_dir / "adapters"),
                    {r["step"]: (r["loss"], r["grad_norm"]) for r in step_records(run_dir, kind)}, seconds)
    shutil.rmtree(run_dir)
    return ref


def wait_for_metrics(run_dir: Path, proc: subprocess.Popen, limit: float = 300) -> float:
    """Wait until the run has started training (its metrics file exists); returns time.monotonic()."""
    end = time.monotonic() + limit
    while not (run_dir / "metrics.jsonl").exists():
        if proc.poll() is not None or time.monotonic() > end:
            break
        time.sleep(0.01)
    return time.monotonic()


def wait_for_steps(run_dir: Path, kind: str, steps: int, proc: subprocess.Popen, old_file: int | None) -> None:
    """Wait until the new run's metrics file (not `old_file`, the inode of the run it overwrites) holds `steps`
    step records of `kind` (or the process has ended)."""
    marker = f'"kind": "{kind}"'.encode()
    while proc.poll() is None:
        try:
            path = run_dir / "metrics.jsonl"
            logged = -1 if path.stat().st_ino == old_file else sum(marker in line
                                                                   for line in path.read_bytes().splitlines())
        except FileNotFoundError:
            logged = -1
        if logged >= steps:
            return
        time.sleep(0.01)


def run_trial(ws: Path, stage: str, ref: Reference, rng: random.Random, use_hook: bool) -> Trial:
    cmd, cfg_file, kind, total_steps, n_checkpoints = STAGES[stage]
    run_dir = ws / "logs" / ("sft" if stage == "sft" else "grpo")
    env = os.environ.copy()
    if use_hook:
        env["WORDLE_MLX_FAULT"] = f"checkpoint-write:{rng.randint(1, n_checkpoints)}"
    trial = Trial(stage, env.get("WORDLE_MLX_FAULT", "timer"))
    old = run_dir / "metrics.jsonl"
    old_file = old.stat().st_ino if old.exists() else None
    proc = subprocess.Popen(cli_command() + [cmd, "--config", cfg_file, "--overwrite", "--no-progress"], cwd=ws,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not use_hook:      # after a random number of logged steps, at a random moment of the next step
        wait_for_steps(run_dir, kind, rng.randint(0, total_steps - 1), proc, old_file)
        try:
            proc.wait(timeout=rng.uniform(0, ref.train_seconds / total_steps))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=600)
    trial.killed = proc.returncode in (-signal.SIGKILL, 137)
    if not trial.killed and proc.returncode != 0:
        trial.problems.append(f"run exited {proc.returncode} without being killed")
        return trial
    trial.killed_after_step = len(step_records(run_dir, kind)) if (run_dir / "metrics.jsonl").exists() else 0
    on_disk = complete_checkpoint_steps(run_dir)
    if trial.killed:
        if on_disk:
            done = run_cli([cmd, "--resume", str(run_dir)], ws)
            trial.resumed_from = on_disk[-1]
        else:     # killed before the first checkpoint: resume must refuse cleanly, then start afresh
            done = run_cli([cmd, "--resume", str(run_dir)], ws)
            if done.returncode != 2 or len(done.stderr.strip().splitlines()) != 1:
                trial.problems.append(f"resume without a checkpoint: exit {done.returncode}, stderr {done.stderr!r}")
            done = run_cli([cmd, "--config", cfg_file, "--overwrite"], ws)
        if done.returncode != 0 or "Traceback" in done.stderr:
            trial.problems.append(f"resume failed: exit {done.returncode}: {done.stderr.strip()[-300:]}")
            return trial
    check_finished_run(run_dir, kind, total_steps, ref, trial)
    return trial


def check_finished_run(run_dir: Path, kind: str, total_steps: int, ref: Reference, trial: Trial) -> None:
    import numpy as np

    records = step_records(run_dir, kind)
    steps = [r["step"] for r in records]
    if steps != list(range(1, total_steps + 1)):
        trial.problems.append(f"metrics steps {steps}, expected 1..{total_steps} once each")
    for r in records:
        if ref.steps.get(r["step"]) != (r["loss"], r["grad_norm"]):
            trial.problems.append(f"step {r['step']}: loss/grad_norm {(r['loss'], r['grad_norm'])} differ from "
                                  f"the uninterrupted run's {ref.steps.get(r['step'])}")
            break
    runs = step_records(run_dir, "run")
    if trial.resumed_from is not None and runs[-1].get("resumed_from_step") != trial.resumed_from:
        trial.problems.append(f"resumed from step {runs[-1].get('resumed_from_step')}, but the newest complete "
                              f"checkpoint was step {trial.resumed_from}")
    got = adapter_tensors(run_dir / "adapters")
    if set(got) != set(ref.adapters) or any(not np.array_equal(got[k].view(np.uint32), ref.adapters[k].view(np.uint32))
                                            for k in got):
        trial.problems.append("final adapter differs from the uninterrupted run's")
    leftovers = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    if leftovers:
        trial.problems.append(f"temp folders left in checkpoints/: {leftovers}")


def disk_full_trial(ws: Path) -> Trial:
    """SFT with its run folder on a 300 KB tmpfs: the 3rd checkpoint (~116 KB each; a run keeps its two newest,
    removing the older ones after writing a new one) cannot fit beside the two before it."""
    trial = Trial("sft-disk-full", "tmpfs")
    mnt = Path(tempfile.mkdtemp(prefix="wordle-full-"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mnt)], capture_output=True).returncode:
        mnt.rmdir()
        trial.problems.append("skipped: cannot mount a tmpfs here (needs root)")
        return trial
    try:
        cfg = json.loads(json.dumps(CONFIGS["sft.json"]))
        cfg["run"]["logs_dir"], cfg["data"]["folder"] = str(mnt), str(ws / "data")
        (ws / "sft_full.json").write_text(json.dumps(cfg))
        done = run_cli(["sft", "--config", "sft_full.json"], ws)
        lines = done.stderr.strip().splitlines()
        on_disk = complete_checkpoint_steps(mnt / "sft")
        trial.killed_after_step, trial.resumed_from = len(step_records(mnt / "sft", "train")), on_disk[-1] if on_disk else None
        trial.how += f": exit {done.returncode}: {lines[-1] if lines else ''}"
        if done.returncode == 0:
            trial.problems.append("the run did not fill the disk")
        if "Traceback" in done.stderr or len(lines) != 1 or str(mnt / "sft" / "checkpoints") not in lines[0]:
            trial.problems.append(f"error is not one line naming the path: {done.stderr!r}")
        from wordle_mlx.llm.model.lora import latest_checkpoint
        latest = latest_checkpoint(mnt / "sft" / "checkpoints")
        if not on_disk or latest is None or latest.name != f"step_{on_disk[-1]:06d}":
            trial.problems.append(f"previous checkpoint lost: on disk {on_disk}, latest {latest}")
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        mnt.rmdir()
    return trial


def summarise(trials: list[Trial]) -> dict:
    out = {}
    for stage in sorted({t.stage for t in trials}):
        ts = [t for t in trials if t.stage == stage]
        out[stage] = {"tried": len(ts), "killed": sum(t.killed for t in ts),
                      "killed_in_checkpoint_write": sum(t.killed and t.how.startswith("checkpoint-write") for t in ts),
                      "killed_before_first_checkpoint": sum(t.killed and t.resumed_from is None for t in ts),
                      "survived": sum(t.survived for t in ts), "lost": sum(not t.survived for t in ts),
                      "steps_redone": sum(max(0, t.killed_after_step - (t.resumed_from or 0)) for t in ts if t.killed)}
    return out


def main() -> int:
    from wordle_mlx.runtime.blas import reexec_for_linux_cpu
    reexec_for_linux_cpu()
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=20, help="Kills per command (sft and train).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--disk-full", action="store_true", help="Also fill a tmpfs during a checkpoint (root).")
    parser.add_argument("--keep", type=Path, help="Work in this folder and keep it.")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tmp = None if args.keep else tempfile.TemporaryDirectory()
    ws = make_workspace(args.keep or Path(tmp.name))
    trials: list[Trial] = []
    start = time.perf_counter()
    for stage in STAGES:
        ref = reference_run(ws, stage)
        print(f"{stage}: reference run, training loop {ref.train_seconds:.1f} s", flush=True)
        kills, i = 0, 0
        while kills < args.kills and i < 2 * args.kills:     # a run may finish before its kill time comes
            t = run_trial(ws, stage, ref, rng, use_hook=(i % 3 == 2))
            trials.append(t)
            kills, i = kills + t.killed, i + 1
            print(f"  {stage} #{i:2d} {t.how:20s} killed={t.killed!s:5s} after step {t.killed_after_step}, "
                  f"resumed from {t.resumed_from}: {'ok' if t.survived else '; '.join(t.problems)}", flush=True)
    if args.disk_full:
        t = disk_full_trial(ws)
        trials.append(t)
        print(f"disk full: {t.how}: {'ok' if t.survived else '; '.join(t.problems)}")
    print(json.dumps(summarise(trials), indent=1))
    print(f"{time.perf_counter() - start:.0f} s")
    print(f"survived {sum(t.survived for t in trials)}/{len(trials)}")     # trials whose checks all passed
    if tmp is not None:
        tmp.cleanup()
    return 0 if all(t.survived for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())

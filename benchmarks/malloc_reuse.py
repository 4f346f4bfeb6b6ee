"""A real SFT pass with glibc's default malloc against the malloc tunables the CLI sets on Linux (`runtime/blas.py`).

MLX's CPU allocator is plain malloc. glibc serves each block over 32 MB with a fresh mmap and unmaps it on free,
so every step the kernel zeroes new pages for the step's logits, activations and gradients. The CLI re-executes
itself with `blas.MALLOC_TUNABLES` in GLIBC_TUNABLES (no mmap, no trimming, one arena, transparent huge pages), so
freed blocks stay in the heap. This script runs the same `wordle-mlx sft` pass (the recipe's last coverage pass,
stage `sft-cover3` of config/recipe.json for the 270M: words loss plus `train_free`, last 6 blocks, here from the
shipped adapter) as
whole processes, alternating the two settings (an empty GLIBC_TUNABLES keeps glibc's defaults), each alone on the
cores. Per run: wall seconds, the median step (from the metrics' step times, step 2 on), peak RSS and minor page
faults (os.wait4), and whether its losses equal the first run's bit for bit. Without `--data` it first writes
the recipe's broad SFT data to a temporary folder with `wordle-mlx data`.
Last line: `speedup X.XX` (median step, defaults over tunables).
Usage: python benchmarks/malloc_reuse.py [--steps 30] [--repeats 2] [--data DIR]
       [--adapter adapters/gemma-3-270m-wordle] [--smoke]
(--smoke: the same pass on builtin:tiny-random from a fresh LoRA on its last block, with 32 train and 32 valid
examples; seconds, for the tests)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import MALLOC_TUNABLES  # noqa: E402
from wordle_mlx.storage.metrics import record_kind  # noqa: E402

CLI = [sys.executable, "-m", "wordle_mlx"]


def recipe_stage(name: str) -> dict:
    """The config `wordle-mlx recipe` builds for stage `name` of config/recipe.json on the builtin 270M."""
    from wordle_mlx.stages.recipe import build_stages

    _, stages = build_stages(str(ROOT / "config" / "recipe.json"), "builtin:gemma-3-270m", ship_exists=False)
    return next(s for s in stages if s.name == name).config.model_dump(mode="json")


def write_config(workdir: Path, data: Path, adapter: Path, steps: int, smoke: bool = False) -> Path:
    cfg = recipe_stage("sft-cover3")
    cfg["model"]["adapter"] = str(adapter.resolve())
    if smoke:
        cfg["model"].update(name="builtin:tiny-random", adapter=None)
        cfg["lora"].update(num_layers=1, train_layers=None)    # a fresh LoRA on the last of its 2 blocks
    cfg["data"]["folder"] = str(data.resolve())
    cfg["run"].update(logs_dir=str(workdir / "logs"), name="malloc-bench", steps=steps, save_every=10 * steps)
    cfg["validation"] = {"every": 10 * steps, "batches": 1}
    path = workdir / "sft.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


def run_pass(config: Path, tunables: str, workdir: Path) -> dict:
    env = {**os.environ, "GLIBC_TUNABLES": tunables}
    start = time.perf_counter()
    proc = subprocess.Popen(CLI + ["sft", "--config", str(config), "--overwrite", "--no-progress"], env=env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: wordle-mlx sft failed with GLIBC_TUNABLES={tunables!r}:\n{stderr[-2000:]}")
    records = [json.loads(line) for line in (workdir / "logs/malloc-bench/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if record_kind(r) == "train"]
    gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:])]
    return {"wall": wall, "step": statistics.median(gaps), "rss_gb": usage.ru_maxrss / 1e6,
            "faults": usage.ru_minflt, "losses": [r["loss"] for r in steps]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", type=Path, help="an SFT data folder (default: the recipe's broad data, written now)")
    parser.add_argument("--adapter", type=Path, default=ROOT / "adapters/gemma-3-270m-wordle")
    parser.add_argument("--smoke", action="store_true", help="the tiny model, a fresh LoRA and 32 examples: seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="malloc-bench-") as tmp:
        workdir = Path(tmp)
        data = args.data
        if data is None:
            data = workdir / "data"
            size = ["--train-examples", "32", "--valid-examples", "32"] if args.smoke else []
            data_config = workdir / "data.json"
            data_config.write_text(json.dumps(recipe_stage("data"), indent=2))
            subprocess.run(CLI + ["data", "--config", str(data_config), "--out", str(data), *size], cwd=ROOT,
                           check=True, stdout=subprocess.DEVNULL)
        config = write_config(workdir, data, args.adapter, args.steps, args.smoke)
        settings = {"glibc defaults": "", "malloc tunables": MALLOC_TUNABLES}
        runs: dict[str, list[dict]] = {name: [] for name in settings}
        first_losses = None
        print(f"{args.steps} steps of an SFT pass at the recipe's sft-cover3 settings, {args.repeats} runs of each "
              "setting, alternated", flush=True)
        for repeat in range(args.repeats):
            for name, tunables in settings.items():
                r = run_pass(config, tunables, workdir)
                first_losses = first_losses or r["losses"]
                runs[name].append(r)
                print(f"  {name:16s} run {repeat + 1}: wall {r['wall']:6.1f} s, median step {r['step']:.2f} s, "
                      f"peak RSS {r['rss_gb']:.2f} GB, minor faults {r['faults']:>9,}, "
                      f"losses identical: {r['losses'] == first_losses}", flush=True)
    for name, rs in runs.items():
        print(f"{name:16s} median step {statistics.median(r['step'] for r in rs):.2f} s, "
              f"median wall {statistics.median(r['wall'] for r in rs):.1f} s, "
              f"peak RSS {max(r['rss_gb'] for r in rs):.2f} GB")
    base, tuned = (statistics.median(r["step"] for r in rs) for rs in runs.values())
    print(f"speedup {base / tuned:.2f}")


if __name__ == "__main__":
    main()

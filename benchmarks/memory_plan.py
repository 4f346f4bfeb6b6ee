"""The memory planner's estimate beside MLX's measured peak, for one SFT and one GRPO step at two batch sizes.

Makes its own inputs in a temporary folder: a small SFT data set from `wordle-mlx data` (compact prompts,
letters replies, every board after 3 earlier guesses, so that every batch is about as long as the longest), then runs
the real stages for one step each on builtin:gemma-3-270m (float32 on CPU): `sft` at batch sizes 4 and 16,
`train` (GRPO, G = 4 plus the greedy reply, boards after 4 earlier guesses) at 2 and 8 boards a step,
starting from the shipped adapter: its replies are well-formed, so rewards differ within a group and the update runs
(the base model's replies all score alike, every group would be skipped and only the rollout measured; the script
stops if that happens). Before each run it frees MLX's cache
and resets the peak counter; after it, `mx.get_peak_memory()` is the measured peak. The estimate is
`wordle-mlx plan`'s for the same config. Prints one row per run and ends with `max_error X%` (the largest
|estimate - measured| / measured).

    .venv/bin/python benchmarks/memory_plan.py [--sft-batches 4 16] [--grpo-boards 2 8] [--smoke]

`--smoke` runs the same stages on builtin:tiny-random, GRPO from a fresh LoRA in words decoding (every reply of the
random model is an allowed word, so groups have reward spread): seconds, for the tests; its errors mean nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


ROOT = Path(__file__).resolve().parents[1]
MODEL = "builtin:gemma-3-270m"
ADAPTER = ROOT / "adapters" / "gemma-3-270m-wordle"   # plays well-formed replies, so groups have reward spread
TINY = "builtin:tiny-random"                           # --smoke's model
PROMPT = {"require_think": False, "context": "summary", "style": "compact", "guess_format": "letters"}


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def sft_config(root: Path, batch: int, smoke: bool = False) -> dict:
    return {"model": {"name": TINY if smoke else MODEL, "dtype": "float32"},
            "data": {"folder": str(root / "data"), "batch_size": batch, "max_seq_length": 256, "pad_to": 16},
            "run": {"logs_dir": str(root / "logs"), "name": f"sft-b{batch}", "steps": 1, "save_every": 1,
                    "progress": False},
            "lora": {"rank": 16, "scale": 20.0, "num_layers": -1}, "validation": {"every": 0}}


def grpo_config(root: Path, boards: int, smoke: bool = False) -> dict:
    # the prompt is the one the shipped adapter records (PROMPT); free decoding: what the planner models
    # (grammar decoding keeps 26-entry logit rows, far less)
    if smoke:
        cfg = grpo_config(root, boards)
        cfg["rl"].pop("k_weights")              # empty boards: a reply's information gain varies the most there
        return {**cfg, "model": {"name": TINY, "dtype": "float32", "adapter": None}, "decode": "words",
                "reward": {"early": 1.2}}
    return {"model": {"name": MODEL, "dtype": "float32", "adapter": str(ADAPTER)},
            "run": {"logs_dir": str(root / "logs"), "name": f"grpo-b{boards}", "steps": 1, "save_every": 0,
                    "progress": False},
            "optimizer": {"learning_rate": 1e-5},
            "rl": {"batch_prompts": boards, "num_generations": 4, "max_tokens_per_microbatch": 2048,
                   "k_weights": [0.0, 0.0, 0.0, 0.0, 1.0]},
            "decode": "free", "max_tokens": 16, "validation": {"every": 0}}


def measured_peak(run) -> int:
    import mlx.core as mx

    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    run()
    peak = mx.get_peak_memory()
    gc.collect()
    mx.clear_cache()
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft-batches", type=int, nargs="*", default=[4, 16], help="SFT batch sizes to run.")
    ap.add_argument("--grpo-boards", type=int, nargs="*", default=[2, 8], help="GRPO boards a step to run.")
    ap.add_argument("--smoke", action="store_true", help="The tiny model, GRPO in words decoding: seconds.")
    args = ap.parse_args()

    from wordle_mlx.config import load_config
    from wordle_mlx.planning.memory import GB
    from wordle_mlx.planning import stage_plan
    from wordle_mlx.stages import data, grpo, sft
    from wordle_mlx.stages.grpo_config import GRPOConfig

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data.run(load_config(write(root / "data.json", {
            "out": str(root / "data"), "seed": 0, "train_examples": 64, "valid_examples": 8,
            "think_style": "none", "prompt": PROMPT, "progress": False,
            "history": {"k_weights": [0.0, 0.0, 0.0, 1.0]}}), data.DataConfig))
        runs = [("sft", "batch_size", b, write(root / f"sft{b}.json", sft_config(root, b, args.smoke)))
                for b in args.sft_batches]
        runs += [("grpo", "batch_prompts", b, write(root / f"grpo{b}.json", grpo_config(root, b, args.smoke)))
                 for b in args.grpo_boards]
        for kind, field, batch, path in runs:
            if kind == "sft":
                cfg = load_config(path, sft.SFTConfig)
                peak = measured_peak(lambda: sft.run(cfg))
            else:
                cfg = load_config(path, GRPOConfig)
                peak = measured_peak(lambda: grpo.run(cfg))
                step = [r for r in map(json.loads, (root / "logs" / cfg.run.name / "metrics.jsonl").read_text()
                                       .splitlines()) if r.get("kind") == "train"][-1]
                if not step["trained_tokens"]:         # a skipped update would leave the update phase unmeasured
                    raise SystemExit(f"{cfg.run.name}: every group had equal rewards, the update did not run")
            dims, numbers, _, _ = stage_plan.build_plan(kind, cfg)
            estimate = stage_plan.plan_for(kind, dims, numbers).peak
            rows.append((kind, f"{field} {batch}", estimate, peak))
    print(f"{'stage':<6} {'batch':<16} {'estimate GB':>12} {'measured GB':>12} {'error':>8}")
    errors = []
    for kind, batch, estimate, peak in rows:
        errors.append(abs(estimate - peak) / peak)
        print(f"{kind:<6} {batch:<16} {estimate / GB:12.3f} {peak / GB:12.3f} {100 * (estimate - peak) / peak:+7.1f}%")
    print(f"max_error {100 * max(errors):.1f}%")


if __name__ == "__main__":
    from wordle_mlx.runtime.blas import reexec_for_linux_cpu

    reexec_for_linux_cpu()           # as the CLI does: MLX's bundled reference BLAS is ~30x slower on Linux
    main()

"""GRPO step time with 1 rank vs 2 ranks (same global batch) on localhost, and the all_sum cost of LoRA grads.

`python benchmarks/distributed_scaling.py [--steps 4] [--batch-prompts 4] [--generations 4] [--port 45871]`
runs the real `wordle-mlx train` stage on the tiny model twice: once as a plain process, once under
`mlx.launch -n 2 --backend ring -p PORT` (each rank plays half of the B games, G replies sampled to each board
plus the greedy one the game goes on with), and reports the median
rollout / update / step seconds of steps 2.. (step 1 includes compilation warm-up). Each rank also times
`mx.distributed.all_sum` of a float32 vector the size of the LoRA gradient of gemma-3-270m and of
gemma-3-4b (rank 8, all linear layers) over the ring backend on localhost. On a box with 2 cores the two
ranks share the cores, so no speed-up is expected here; on two Macs each rank has its own chip, the
rollout (most of a step) halves and the only added cost is that one all_sum per step. It launches itself
(no other command first); the last line is `speedup X.XX`, 1 rank's median step seconds over 2 ranks'.
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

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# LoRA rank 8 on q,k,v,o,gate,up,down: sum over layers of rank * (in + out)
LORA_PARAMS = {"gemma-3-270m": 18 * 8 * (2 * (640 + 1024) + 2 * (640 + 256) + 3 * (640 + 2048)),
               "gemma-3-4b": 34 * 8 * (2 * (2560 + 2048) + 2 * (2560 + 1024) + 3 * (2560 + 10240))}


def child(args) -> None:
    import mlx.core as mx

    from wordle_mlx.config import validate_config
    from wordle_mlx.llm.training.distributed import init_world
    from wordle_mlx.stages import grpo

    world = init_world()
    # words decoding: every reply of the random model is an allowed word, whose info gain differs from its
    # group's others, so the groups have a reward spread and every step runs the update and its all_sum
    cfg = validate_config({
        "model": {"name": "builtin:tiny-random", "adapter": None}, "lora": {"rank": 8},
        "optimizer": {"name": "adamw", "min_lr_ratio": 0.0},
        "run": {"steps": args.steps, "save_every": 0, "seed": 1, "logs_dir": args.out, "name": f"ranks{world.size}",
                "progress": False},
        "rl": {"batch_prompts": args.batch_prompts, "num_generations": args.generations},
        "decode": "words", "max_tokens": 16, "reward": {"early": 1.2}, "validation": {"every": 0}},
        grpo.GRPOConfig, "bench")
    grpo.run(cfg)
    allsum = {}
    if world.size > 1:
        for name, n in LORA_PARAMS.items():
            x = mx.ones((n,), dtype=mx.float32)
            mx.eval(mx.distributed.all_sum(x))                 # warm-up
            times = []
            for _ in range(5):
                start = time.perf_counter()
                mx.eval(mx.distributed.all_sum(x))
                times.append(time.perf_counter() - start)
            allsum[name] = {"params": n, "mb_fp32": 4 * n / 1e6, "median_s": statistics.median(times)}
    if world.is_main:
        Path(args.out, f"allsum{world.size}.json").write_text(json.dumps(allsum))


def summary(run_dir: Path) -> dict:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r.get("kind") == "train"][1:]
    med = lambda key: statistics.median(r[key] for r in train)  # noqa: E731
    return {"rollout_s": med("rollout_seconds"), "update_s": med("update_seconds"),
            "step_s": statistics.median(r["rollout_seconds"] + r["update_seconds"] for r in train),
            "games_per_step": len(train[0]["games"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch-prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--port", type=int, default=45871, help="first of the 2 localhost ports of the ring backend")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    out = Path(tempfile.mkdtemp(prefix="dist-bench-"))
    me = [str(Path(__file__).resolve()), "--child", "--out", str(out), "--steps", str(args.steps),
          "--batch-prompts", str(args.batch_prompts), "--generations", str(args.generations)]
    subprocess.run([sys.executable, *me], check=True, cwd=REPO)
    subprocess.run([str(BIN / "mlx.launch"), "-n", "2", "--backend", "ring", "-p", str(args.port), "--python",
                    sys.executable, "--", *me], check=True, cwd=REPO, stdin=subprocess.DEVNULL)
    one, two = summary(out / "ranks1"), summary(out / "ranks2")
    allsum = json.loads((out / "allsum2.json").read_text())
    result = {"cpu_count": os.cpu_count(),
              "global_batch": f"{args.batch_prompts} games x ({args.generations} + greedy) replies a board",
              "1_rank": one, "2_ranks": two, "allsum_lora_grad_localhost": allsum}
    print(json.dumps(result, indent=2))
    print(f"speedup {one['step_s'] / two['step_s']:.2f}")      # 1 rank's median step seconds over 2 ranks'


if __name__ == "__main__":
    main()

"""Every stage of the 4B recipe (`make train-4b`) on a full-size Gemma 3 4B checkpoint, and the planner against
MLX's peak.

The checkpoint is random (seeded) but has exactly the shapes, config and layout of
`mlx-community/gemma-3-4b-it-bf16` and `-4bit` (`tests/rehearsal/mac_layouts.rehearsal_model`: text and vision towers,
two 5 GB shards and their index for bf16, mlx-lm's quantizer for 4-bit, Gemma 3's tokenizer files). It is
built once in the user cache (about 11.6 GB for both) and never committed. For each variant the script runs
the configs the recipe runner builds for the 4B model (`tests/rehearsal/recipe.py`: `wordle-mlx recipe --model
mlx-community/gemma-3-4b-it-VARIANT --dtype bfloat16` for its Mac), changing only the model path, the output
folders and the
sizes, at the smallest that still run each code path: plan, data, SFT (2 steps, the config's gradient
checkpointing and loss), self-play (2 + 1 secrets), cover, GRPO (2 steps in the config's decoding), eval
(2 games), fuse (as the chain fuses: 4-bit dequantized) and export (a q8_0 GGUF, deleted after). A random
model never spells a word, so every reply to a board would score alike and GRPO would skip its groups: as in
tests/test_mac_rehearsal.py, the first reply to each board is replaced by a well-formed guess, so the
update runs. For the SFT and GRPO steps it prints `wordle-mlx plan`'s peak for the same shrunk config beside
MLX's measured peak (`plan --measure`'s runs: loading and 2 steps) and the seconds of the second step. bf16
runs at a smaller batch than 4-bit (bf16 matmuls are slow on this CPU) and says so. Ends `max_error X%`:
the largest |plan - measured| / measured over the SFT and GRPO steps and the fuses of both variants. For each
fuse (bf16, and 4-bit with --dequantize) it prints `fuse VARIANT peak_gb X plan_gb Y base_gb B out_gb O` in GiB:
MLX's peak over the fuse (`mx.get_peak_memory` after `mx.reset_peak_memory`), `wordle-mlx plan`'s fuse plan, and
the weights of the base and of the fused output as saved (the base's vision tower included; the fuse drops it).
At full size the 4-bit fuse leaves out its logit check (FULL_SIZE_NO_LOGIT_CHECK); --size tiny checks it.
`--size tiny` runs every stage, export included, on the tests' tiny layouts (tests/test_benchmark_4b_size.py).

    .venv/bin/python benchmarks/gemma3_4b_size.py [--variants 4bit bf16] [--skip-export] [--size tiny]
    .venv/bin/python benchmarks/gemma3_4b_size.py --self-play --variants bf16   # self-play and cover alone
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402
from wordle_mlx.llm.play.rollout import RolloutConfig  # noqa: E402
from tests.rehearsal.recipe import first_reply_a_word, recipe_config as recipe  # noqa: E402

KINDS = {"bf16": "bfloat16", "4bit": "4bit"}
# On this CPU (mlx[cpu]) a bf16 matmul runs at about 7 GFLOP/s and a 4-bit one at 0.35 with bf16 activations
# and 3 with float32 ones (this script prints them first): the full-size run keeps bf16
# weights in bf16, computes the 4-bit model's activations in float32 (the loader's CPU default; on a Mac the
# configs' bfloat16 applies), and uses one example or board a step, on the empty board (the shortest prompts).
FULL_SIZE_DTYPE = {"bf16": "bfloat16", "4bit": "float32"}
# GRPO at full size plays boards with 5 guesses already on them (the longest prompts, which the planner plans
# for) in grammar decoding: a random model's replies are then non-words, so each game ends after its one turn
# (the rollout's max_invalid_replies 1, `OneInvalidReply`) and the well-formed first reply is the only one
# rewarded, which gives the group the spread the update needs. In the recipe's words decoding every reply is a
# word and they score alike; words decoding runs the same letter decoder and update with one more mask, which
# --size tiny runs. The evals play one turn of each game for the same reason.
LAST_TURN = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
# What the full-size run leaves to --size tiny (and the test suite), and why: hours on this CPU, or more memory
# than it has.
FULL_SIZE_SKIPS = {
    ("bf16", "self-play"): "scores every fitting answer of every board it reaches: hours at 7 GFLOP/s",
    ("4bit", "self-play"): "scores every fitting answer of every board it reaches: hours at 3 GFLOP/s",
    ("bf16", "export"): "the bf16 weights (7.2 GiB) beside the 262k x 2560 embedding fused in float32 and its numpy "
                        "and q8_0 copies: most of this host's 24 GB",
}


# The full-size 4-bit fuse runs (its peak is measured) without the forward passes of its logit check; the weight
# checks, the tokenizer check and the round trip through disk stay. --size tiny (and tests/) check its logits.
FULL_SIZE_NO_LOGIT_CHECK = "the 4-bit model with bf16 activations runs at 0.35 GFLOP/s here: about 40 min"


class OneInvalidReply(RolloutConfig):
    """The rollout config GRPO plays with (patched into stages/grpo.py), ending a game at its first invalid reply
    (the stage's games end at the third): the random model's greedy reply, which the game goes on with, is not
    a word."""
    max_invalid_replies: int = 1


class Variant:
    """One checkpoint's run through the chain, in its own temporary folder."""

    def __init__(self, variant: str, model: Path, root: Path, full: bool):
        self.variant, self.model, self.root, self.full = variant, str(model), root, full
        self.dtype = FULL_SIZE_DTYPE[variant] if full else None
        self.rows: list[tuple[str, float, str]] = []
        self.steps: list[dict] = []
        self.fuse_lines: list[tuple] = []

    def write(self, name: str, data: dict) -> Path:
        path = self.root / name
        path.write_text(json.dumps(data))
        return path

    def timed(self, stage: str, run, note: str = "") -> object:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            result = run()
        seconds = time.perf_counter() - start
        self.rows.append((stage, seconds, note))
        print(f"  {self.variant:<5} {stage:<10} {seconds:8.1f} s  {note}", flush=True)
        return result

    def self_play_and_cover(self, adapter: str | None, train_games: int, opener: str | None = None) -> None:
        """`data self-play` on `train_games` train secrets and 1 valid one, then `data cover` on its output."""
        from wordle_mlx.config import load_config
        from wordle_mlx.stages import choice, cover

        play_cfg = self.write("self-play.json", self.config("choice", adapter=adapter,
                                                            out=str(self.root / "self-play"), train_games=train_games,
                                                            valid_games=1, opener=opener, progress=False))
        self.timed("self-play", lambda: choice.run(load_config(play_cfg, choice.ChoiceConfig)),
                   f"{train_games} + 1 secrets" + (f", opener {opener}" if opener else "")
                   + ("" if adapter else ", the base model's choices"))
        self.timed("cover", lambda: cover.run(load_config(None, cover.CoverConfig, {
            "data": str(self.root / "self-play"), "out": str(self.root / "cover"), "max_candidates": 5,
            "copies": 4, "progress": False})), "on the self-play data")

    def skipped(self, stage: str) -> bool:
        """True (and a row saying why) for a stage the full-size run leaves out."""
        why = FULL_SIZE_SKIPS.get((self.variant, stage)) if self.full else None
        if why:
            self.rows.append((stage, 0.0, f"not run at full size: {why}"))
            print(f"  {self.variant:<5} {stage:<10} {'-':>8}    not run at full size: {why}", flush=True)
        return bool(why)

    def plan_and_measure(self, kind: str, path: Path, note: str, keep: str) -> None:
        """`wordle-mlx plan` of the shrunk config, then `plan --measure`'s two steps, whose adapter is kept."""
        from wordle_mlx.stages import plan
        from wordle_mlx.stages.plan_measure import measure_stage

        planned = plan.run(plan.PlanConfig(config=str(path), json_output=True))
        _, cfg = plan.stage_config(str(path))
        measured = self.timed(kind, lambda: measure_stage(kind, cfg, str(path), keep=keep), note)
        error = abs(planned["peak_gb"] - measured["peak_gb"]) / measured["peak_gb"]
        self.steps.append({"variant": self.variant, "stage": f"{kind} step", "plan_gb": planned["peak_gb"],
                           "measured_gb": measured["peak_gb"], "error": error,
                           "seconds_per_step": measured["seconds_per_unit"], "note": note})

    def config(self, stage: str, **changes) -> dict:
        """The recipe's stage `stage` for this variant on this checkpoint (and, at full size, in FULL_SIZE_DTYPE),
        with `changes`."""
        training = stage.startswith(("sft", "grpo"))          # SFT and GRPO: model {name, dtype, ...}
        model = {"model.name": self.model} if training else {"model": self.model}
        if self.dtype:
            model["model.dtype" if training else "dtype"] = self.dtype
        return recipe(stage, self.variant, **model, **changes)

    def run(self, export: bool, steps_only: bool = False) -> None:
        from wordle_mlx.config import load_config
        from wordle_mlx.llm.play import generation
        from wordle_mlx.stages import data, evaluate, export as export_stage, fuse, grpo as grpo_stage, plan

        v, logs, full = self.variant, str(self.root / "logs"), self.full
        for name in ("sft", "grpo-cover", "eval", "choice"):
            cfg = self.write(f"plan-{name}.json", self.config(name))
            self.timed("plan", lambda: plan.run(plan.PlanConfig(config=str(cfg), json_output=True)), name)
        shortest = {"history.k_weights": [1.0]} if full else {}      # the empty board: the shortest prompts
        data_cfg = self.write("data.json", recipe("data", v, out=str(self.root / "data"), train_examples=16,
                                                  valid_examples=4, tokenizer=self.model, progress=False, **shortest))
        self.timed("data", lambda: data.run(load_config(data_cfg, data.DataConfig)), "16 + 4 examples")
        batch = 1 if full else 2
        sft_cfg = self.write("sft.json", self.config("sft", **{
            "data.folder": str(self.root / "data"), "data.batch_size": batch, "run.logs_dir": logs, "run.steps": 2,
            "run.save_every": 0, "run.name": "sft", "validation.every": 0}))
        sft_adapter = str(self.root / "sft-adapter")
        grad_checkpoint = recipe("sft", v).get("model", {}).get("grad_checkpoint", False)
        self.plan_and_measure("sft", sft_cfg, f"batch {batch}, grad_checkpoint {grad_checkpoint}, "
                              f"{self.dtype or 'bfloat16'}", sft_adapter)
        if not self.skipped("self-play"):
            self.self_play_and_cover(sft_adapter, train_games=2)
        boards = 1 if full else 2
        grpo_cfg = self.write("grpo.json", self.config("grpo-cover", **{
            "model.adapter": sft_adapter, "run.logs_dir": logs, "run.name": "grpo", "run.steps": 2,
            "run.save_every": 0, "rl.batch_prompts": boards, "rl.num_generations": 2, "validation.every": 0,
            **({"rl.k_weights": LAST_TURN, "decode": "grammar"} if full else {})}))
        grpo_adapter = str(self.root / "grpo-adapter")
        # the sampler is patched where the stage looks it up (stages/grpo.py imports it at the top)
        sampler = first_reply_a_word(generation.BatchedGenerator)
        with mock.patch.object(generation, "BatchedGenerator", sampler), \
                mock.patch.object(grpo_stage, "BatchedGenerator", sampler, create=True), \
                mock.patch.object(grpo_stage, "RolloutConfig", OneInvalidReply):
            decode = "grammar" if full else recipe("grpo-cover", v).get("decode", "grammar")
            self.plan_and_measure("grpo", grpo_cfg, f"{boards} board(s) x (2 + greedy), {decode} decoding, "
                                  f"{self.dtype or 'bfloat16'}", grpo_adapter)
        if steps_only:
            return
        games = 1 if full else 2
        one_turn = {"rollout.max_turns": 1} if full else {}
        eval_cfg = self.write("eval.json", self.config("eval", adapter=grpo_adapter, games=games,
                                                       baselines=False, out=str(self.root / "eval.json"),
                                                       progress=False, json_output=True, **one_turn))
        self.timed("eval", lambda: evaluate.run(load_config(eval_cfg, evaluate.EvalConfig)),
                   f"{games} game(s)" + (", one turn each" if full else ""))
        fused = self.root / "fused"
        if not self.skipped("fuse"):
            result = self.fuse(fuse.FuseConfig(model=self.model, adapter=grpo_adapter, out=str(fused),
                                               dequantize=v == "4bit", dtype="bfloat16"))
            fused_eval = self.write("eval-fused.json", recipe(
                "eval", v, model=str(fused), dtype="bfloat16", games=games, baselines=False,
                out=str(self.root / "eval-fused.json"), progress=False, json_output=True, **one_turn))
            gap = ("fuse logits not checked at full size" if result["max_abs_logit_diff"] is None else
                   f"fuse logit gap {result['max_abs_logit_diff']:.3g} <= {result['tolerance']:.3g}")
            self.timed("eval fused", lambda: evaluate.run(load_config(fused_eval, evaluate.EvalConfig)),
                       f"{games} game(s); {gap}")
            shutil.rmtree(fused, ignore_errors=True)
        if export and not self.skipped("export"):
            gguf = self.root / "player.gguf"
            self.timed("export", lambda: export_stage.run(export_stage.ExportConfig(
                adapter=grpo_adapter, out=str(gguf), model=self.model, dtype="q8", json_output=True)),
                "q8_0 GGUF")
            gguf.unlink(missing_ok=True)

    def fuse(self, cfg) -> dict:
        """`fuse` as the chain runs it, with MLX's peak over it beside `wordle-mlx plan`'s fuse plan and the
        weights of the base and of the output as saved; a `fuse VARIANT peak_gb ...` line and a table row."""
        import gc

        import mlx.core as mx
        from wordle_mlx.planning.fuse_plan import fuse_report
        from wordle_mlx.stages import fuse

        check = not (self.full and self.variant == "4bit")
        gc.collect()
        mx.clear_cache()
        mx.reset_peak_memory()
        result = self.timed("fuse", lambda: fuse.run(cfg, check_logits=check),
                            ("dequantized to bf16" if cfg.dequantize else "bf16")
                            + ("" if check else f"; logits not checked at full size: {FULL_SIZE_NO_LOGIT_CHECK}"))
        peak = mx.get_peak_memory() / GIB
        plan = fuse_report("fuse", cfg)["peak_gb"]
        base, out = saved_gb(Path(cfg.model)), saved_gb(Path(cfg.out))
        error = abs(plan - peak) / peak
        print(f"fuse {self.variant} peak_gb {peak:.2f} plan_gb {plan:.2f} base_gb {base:.2f} out_gb {out:.2f}",
              flush=True)
        self.fuse_lines.append((self.variant, peak, plan, base, out))
        self.steps.append({"variant": self.variant, "stage": "fuse", "plan_gb": plan, "measured_gb": peak,
                           "error": error, "seconds_per_step": self.rows[-1][1],
                           "note": f"peak / max(base, out) {peak / max(base, out):.2f} (acceptance <= 1.3)"})
        return result


GIB = 1024 ** 3


def saved_gb(folder: Path) -> float:
    """GiB of the weights a model folder saves (its .safetensors files, a vision tower's included)."""
    return sum(p.stat().st_size for p in folder.glob("*.safetensors")) / GIB


def kernel_rates() -> None:
    """GFLOP/s of one 4B MLP projection (2560 x 10240) at 64 rows: bf16, float32, 4-bit with bf16 and with
    float32 activations."""
    import mlx.core as mx

    k, n, m = 2560, 10240, 64
    w = mx.random.normal((n, k)).astype(mx.bfloat16)
    wq, scales, biases = mx.quantize(w, group_size=64, bits=4)
    x = mx.random.normal((m, k))
    w32, s32, b32, xb = w.astype(mx.float32), scales.astype(mx.float32), biases.astype(mx.float32), x.astype(mx.bfloat16)
    mx.eval(w, wq, scales, biases, x, w32, s32, b32, xb)
    for name, f in (("bf16", lambda: xb @ w.T), ("float32", lambda: x @ w32.T),
                    ("4-bit, bf16 activations", lambda: mx.quantized_matmul(xb, wq, scales, biases)),
                    ("4-bit, float32 activations", lambda: mx.quantized_matmul(x, wq, s32, b32))):
        mx.eval(f())
        start = time.perf_counter()
        mx.eval(f())
        print(f"matmul {name}: {2 * m * k * n / (time.perf_counter() - start) / 1e9:.2f} GFLOP/s", flush=True)


def main() -> None:
    reexec_for_linux_cpu()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["4bit", "bf16"], choices=sorted(KINDS))
    ap.add_argument("--skip-export", action="store_true")
    ap.add_argument("--size", choices=["4b", "tiny"], default="4b",
                    help="tiny: the same chain on the tests' tiny Mac layouts (a quick check of this script)")
    ap.add_argument("--self-play", action="store_true",
                    help="only self-play (1 + 1 secrets, the empty board's label given, the base model) and cover, "
                         "which the full chain leaves out at full size")
    ap.add_argument("--steps-only", action="store_true", help="only plan, data and the SFT and GRPO steps")
    args = ap.parse_args()

    from wordle_mlx.runtime.blas import describe_blas
    from tests.rehearsal.mac_layouts import make_mac_layout, rehearsal_model

    print(f"Gemma 3 4B at {'full' if args.size == '4b' else 'tiny'} size, random weights; {describe_blas()}")
    kernel_rates()
    steps, fuse_lines, scratch = [], [], Path(tempfile.mkdtemp(prefix="wordle-mlx-4b-layouts-"))
    for variant in args.variants:
        start = time.perf_counter()
        model = (rehearsal_model(KINDS[variant]) if args.size == "4b"
                 else make_mac_layout(scratch / variant, KINDS[variant]))
        print(f"{variant}: checkpoint {model} ready in {time.perf_counter() - start:.0f} s", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"wordle-mlx-4b-{variant}-") as tmp:
            run = Variant(variant, model, Path(tmp), full=args.size == "4b")
            if args.self_play:
                run.self_play_and_cover(None, train_games=1, opener="crane")
                continue
            run.run(export=not args.skip_export, steps_only=args.steps_only)
            steps += run.steps
            fuse_lines += run.fuse_lines
    shutil.rmtree(scratch, ignore_errors=True)
    if not steps:
        return
    print()
    print(f"{'variant':<8}{'step':<11}{'plan GB':>9}{'measured GB':>13}{'error':>8}{'s/step':>9}  setting")
    for s in steps:
        print(f"{s['variant']:<8}{s['stage']:<11}{s['plan_gb']:9.2f}{s['measured_gb']:13.2f}{s['error']:8.1%}"
              f"{s['seconds_per_step']:9.1f}  {s['note']}")
    for variant, peak, plan, base, out in fuse_lines:
        print(f"fuse {variant} peak_gb {peak:.2f} plan_gb {plan:.2f} base_gb {base:.2f} out_gb {out:.2f}")
    print(f"max_error {100 * max(s['error'] for s in steps):.1f}%")


if __name__ == "__main__":
    main()

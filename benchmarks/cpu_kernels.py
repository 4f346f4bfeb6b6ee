"""CPU speed-ups measured side by side: OpenBLAS kernel choice, the fast GELU, the numpy cross-entropy and a
whole SFT step.

1. fp32 2048x2048 matmul in MLX with OpenBLAS's own CPU detection (OPENBLAS_CORETYPE unset) against the
   core type `wordle_mlx.runtime.blas` sets from the CPU flags; each in a fresh process, alternated.
2. `nn.gelu_approx` against `cpu_kernels.gelu_approx_fast` on a (1024, 2048) block: forward and gradient,
   plus the largest difference in value and gradient.
3. `nn.losses.cross_entropy` against `cpu_kernels.cross_entropy` over the vocabulary: the value and gradient of
   the weighted loss of `--vocab-rows` hidden states (208: a `train_free` batch of 16 replies of 13 tokens)
   projected onto a random (262144, 640) head, the full loss `train_free` adds to an SFT step. With
   `--sft-config`, a real `train_free` SFT step of that config (for example the recipe's last coverage pass, as
   `make train-270m` wrote it), with the numpy gradient's subnormal entries
   flushed to 0 and not (`real_sft_step`).
4. One LoRA SFT gradient step (value_and_grad + eval) of the 270M on the same random batch, with mlx-lm's
   GELU and with the fast one (the MLP class is switched back and forth on one model), alternated.
Last line: `speedup X.XX` (the SFT step, exact over fast).
Usage: python benchmarks/cpu_kernels.py [--model builtin:gemma-3-270m] [--batch 16] [--length 80] [--repeats 3]
       [--sft-config logs/recipe-270m/configs/sft-cover3.json] [--matmul-size 2048]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import find_openblas, openblas_coretype, reexec_for_linux_cpu  # noqa: E402

MATMUL = ("import time, mlx.core as mx\n"
          "a = mx.random.normal(({n}, {n})); mx.eval(a); mx.eval(a @ a)\n"
          "best = min((lambda t: (mx.eval(a @ a), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))\n"
          "print(2 * {n} ** 3 / best / 1e9)\n")


def matmul_gflops(coretype: str | None, size: int = 2048) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["WORDLE_MLX_NO_REEXEC"] = "1"
    lib = find_openblas()
    if lib:
        env["LD_PRELOAD"] = lib
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run([sys.executable, "-c", MATMUL.format(n=size)], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def best_of(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def real_sft_step(config: str, repeats: int) -> None:
    """A trained model's logits spread so widely that many softmax entries of the full loss's gradient are
    subnormal, and the matmul that carries the gradient back through the head slows down on them (x86 microcode
    assists). `cpu_kernels.cross_entropy` flushes them to 0; this times the step of `config`'s SFT (its model,
    adapter, data and loss, `train_free`) with the flush and without it (`_FLUSH` 0), alternated, on 6 of its
    batches spread over their lengths."""
    import dataclasses
    from unittest import mock

    import mlx.core as mx
    import mlx.nn as nn

    from wordle_mlx.config import load_config, resolve_path
    from wordle_mlx.llm.model import cpu_kernels
    from wordle_mlx.llm.training.distributed import init_world
    from wordle_mlx.llm.training.policy import load_policy, start_adapter
    from wordle_mlx.llm.training.sft_loss import loss_sum
    from wordle_mlx.stages import sft
    from wordle_mlx.stages.sft_config import SFTConfig

    cfg = load_config(config, SFTConfig)
    data_dir = resolve_path(cfg, cfg.data.folder).resolve()
    train, _, prompt = sft.load_data(data_dir, False)
    model, tokenizer, _, _ = load_policy(cfg.model, cfg.lora, cfg.run.seed, start_adapter(cfg), prompt, cfg.decode,
                                         cfg.train_free)
    batches, _ = sft.prepare_batches(cfg.data, cfg.decode, cfg.train_free, 0, tokenizer, prompt, data_dir, train[:800],
                                     [], init_world())
    batches = batches[:: max(1, len(batches) // 6)][:6]
    step = nn.value_and_grad(model, loss_sum)
    model.train()

    def seconds(batch) -> float:
        start = time.perf_counter()
        (s, n), g = step(model, *batch.loss_args())
        mx.eval(s, n, g)
        return time.perf_counter() - start

    times = {"flushed": [], "not flushed": [], "words loss only": []}
    for _ in range(repeats):
        for batch in batches:
            times["flushed"].append(seconds(batch))
            with mock.patch.object(cpu_kernels, "_FLUSH", 0.0):
                times["not flushed"].append(seconds(batch))
            times["words loss only"].append(seconds(dataclasses.replace(batch, vocab=None)))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"SFT step of {config} (train_free, {batches[0].inputs.shape[0]} examples, median of "
          f"{len(times['flushed'])}): not flushed {med['not flushed']:.2f} s, flushed {med['flushed']:.2f} s "
          f"({med['not flushed'] / med['flushed']:.2f}x); the words loss alone {med['words loss only']:.2f} s, so "
          f"train_free adds {med['not flushed'] - med['words loss only']:.2f} -> "
          f"{med['flushed'] - med['words loss only']:.2f} s a step")


def main() -> None:
    reexec_for_linux_cpu()
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np
    from mlx_lm.models import gemma3_text

    from wordle_mlx.llm.model import cpu_kernels, lora
    from wordle_mlx.llm.model.logits import text_model
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.training.sft_loss import loss_sum

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin:gemma-3-270m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=80)
    parser.add_argument("--targets", type=int, default=12, help="loss positions per sequence")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-rows", type=int, default=208)
    parser.add_argument("--sft-config", default="", help="also time this train_free SFT config's step with the "
                        "gradient's subnormal flush on and off (needs its data and start adapter)")
    parser.add_argument("--matmul-size", type=int, default=2048, help="side of the square fp32 matmul of part 1")
    args = parser.parse_args()

    coretype = openblas_coretype()
    if find_openblas() and coretype:
        detected, chosen = [], []
        for _ in range(2):
            detected.append(matmul_gflops(None, args.matmul_size))
            chosen.append(matmul_gflops(coretype, args.matmul_size))
        print(f"matmul {args.matmul_size} fp32: OpenBLAS's own detection {statistics.median(detected):.1f} GFLOP/s, "
              f"OPENBLAS_CORETYPE={coretype} {statistics.median(chosen):.1f} GFLOP/s, "
              f"ratio {statistics.median(chosen) / statistics.median(detected):.2f}")
    else:
        print("matmul: no system OpenBLAS or no core type to choose on this machine; skipped")

    x = mx.random.normal((1024, 2048)) * 3
    mx.eval(x)
    exact_f = best_of(lambda: mx.eval(nn.gelu_approx(x)), args.repeats)
    fast_f = best_of(lambda: mx.eval(cpu_kernels.gelu_approx_fast(x)), args.repeats)
    exact_grad = mx.grad(lambda v: nn.gelu_approx(v).sum())
    fast_grad = mx.grad(lambda v: cpu_kernels.gelu_approx_fast(v).sum())
    exact_g = best_of(lambda: mx.eval(exact_grad(x)), args.repeats)
    fast_g = best_of(lambda: mx.eval(fast_grad(x)), args.repeats)
    dv = mx.abs(nn.gelu_approx(x) - cpu_kernels.gelu_approx_fast(x)).max().item()
    dg = mx.abs(exact_grad(x) - fast_grad(x)).max().item()
    print(f"gelu (1024x2048): forward {exact_f * 1e3:.1f} -> {fast_f * 1e3:.1f} ms ({exact_f / fast_f:.2f}x), "
          f"gradient {exact_g * 1e3:.1f} -> {fast_g * 1e3:.1f} ms ({exact_g / fast_g:.2f}x); "
          f"max |diff| value {dv:.1e}, gradient {dg:.1e}")

    rows, vocab, width = args.vocab_rows, 262144, 640
    head = mx.random.normal((vocab, width)) * 0.05
    hidden = mx.random.normal((rows, width))
    token_ids = mx.random.randint(0, vocab, (rows,))
    row_weights = mx.random.uniform(shape=(rows,))
    mx.eval(head, hidden, token_ids, row_weights)
    ce_grads = {name: mx.value_and_grad(lambda h, ce=ce: (ce(h @ head.T, token_ids) * row_weights).sum())
                for name, ce in (("mlx", nn.losses.cross_entropy), ("numpy", cpu_kernels.cross_entropy))}
    ce_times = {name: best_of(lambda g=g: mx.eval(g(hidden)), args.repeats) for name, g in ce_grads.items()}
    (v_mlx, g_mlx), (v_np, g_np) = ce_grads["mlx"](hidden), ce_grads["numpy"](hidden)
    print(f"cross-entropy ({rows}x{vocab} logits from a {width}-wide head, value and gradient): "
          f"nn.losses.cross_entropy {ce_times['mlx'] * 1e3:.0f} ms, numpy {ce_times['numpy'] * 1e3:.0f} ms "
          f"({ce_times['mlx'] / ce_times['numpy']:.2f}x); relative difference value "
          f"{abs(v_np.item() - v_mlx.item()) / abs(v_mlx.item()):.1e}, gradient "
          f"{(mx.abs(g_np - g_mlx).max() / mx.abs(g_mlx).max()).item():.1e}")

    if args.sft_config:     # a real train_free SFT step: its gradient with the subnormal flush on and off
        real_sft_step(args.sft_config, args.repeats)

    model, _ = load_model(args.model)          # the SFT step on the base model with a fresh LoRA
    mx.random.seed(0)
    lora.apply_lora(model, -1, lora.lora_parameters(8, 20.0, 0.0, None))
    rng = np.random.default_rng(0)
    b, n, p = args.batch, args.length, args.targets
    top = min(20000, text_model(model).model.args.vocab_size)      # token ids within a small model's vocabulary too
    inputs = mx.array(rng.integers(100, top, size=(b, n)).astype(np.int32))
    positions = mx.array(np.concatenate([i * n + np.arange(n - p, n) for i in range(b)]).astype(np.int32))
    targets = mx.array(rng.integers(100, top, size=positions.shape).astype(np.int32))
    weights = mx.ones(positions.shape)
    step = nn.value_and_grad(model, loss_sum)
    mlps = [m for _, m in model.named_modules() if isinstance(m, gemma3_text.MLP)]
    fast_cls = type(mlps[0]) if type(mlps[0]) is not gemma3_text.MLP else None
    if fast_cls is None:
        cpu_kernels.use_fast_gelu(model)
        fast_cls = type(mlps[0])

    def use(cls):
        for m in mlps:
            m.__class__ = cls

    times = {"exact": [], "fast": []}
    losses = {}
    for _ in range(args.repeats + 1):
        for name, cls in (("exact", gemma3_text.MLP), ("fast", fast_cls)):
            use(cls)
            start = time.perf_counter()
            (s, c), g = step(model, inputs, positions, targets, weights)
            mx.eval(s, c, g)
            times[name].append(time.perf_counter() - start)
            losses[name] = (s / c).item()
    exact_s, fast_s = (statistics.median(times[k][1:]) for k in ("exact", "fast"))
    tokens = b * n
    print(f"SFT LoRA step, batch {b} x {n} tokens, {p} targets each: mlx-lm GELU {tokens / exact_s:.0f} tok/s, "
          f"fast GELU {tokens / fast_s:.0f} tok/s; loss {losses['exact']:.5f} vs {losses['fast']:.5f}")
    print(f"speedup {exact_s / fast_s:.2f}")


if __name__ == "__main__":
    main()

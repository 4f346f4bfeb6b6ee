"""Decoding letters-format replies in free and grammar mode at batch 1, 8, 32 and 64, beside the roofline.

The shipped adapter replies greedily to the same letters-format boards (test words, 0-2 earlier guesses) at each
batch size, in `free` decoding (mlx-lm's BatchGenerator: every step projects onto the 262k-token vocabulary and
takes a log-softmax over it) and in `grammar` decoding (the tags forced, 5 letters picked on the 26 letter rows).
The roofline is what the needed multiply-adds allow at the float32 matmul rate measured in the same run (the
best of 5 rounds before the decoding and 5 after it: a host that lends the cores elsewhere for a minute would
otherwise lower the roofline, once to a fraction of 1.28): the prompt tokens that must run through the body (the shared start once, each distinct
prompt's rest once, no padding; the body's linear layers with LoRA's two factors, or without them where the
grammar decoder folds LoRA into the weights, `packed.fold_lora`), then in free decoding every decoded token through
the body and the head (hidden x vocabulary), in grammar decoding the 4 letters that feed the next one (and any
forced separator) through the body and the 5 letters' 26 head rows, at that many GFLOP/s. Prints, per mode and
batch, seconds, replies/s, decoded tokens/s and the roofline's replies/s; then `grammar_speedup X.XX` at batch 32
(free seconds over grammar) and last `roofline_fraction X.XX`, grammar decoding's replies/s over its roofline's at
batch 64. Each mode first decodes the largest batch once, untimed: a process's first call at a size pays for
growing the heap to it.
Usage: python benchmarks/decode_roofline.py [--adapter adapters/gemma-3-270m-wordle] [--batches 1 8 32 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


def matmul_gflops(rows: int, inner: int, cols: int, repeats: int = 5, rounds: int = 5) -> float:
    """Measured float32 GFLOP/s of a (rows x inner) @ (inner x cols) product: the best of `rounds` rounds of
    `repeats` products, so that a moment when the host lends the core elsewhere does not lower the roofline (one
    round alone once read 97 GFLOP/s on a host that gives 190)."""
    import mlx.core as mx

    a, b = mx.random.normal((rows, inner)), mx.random.normal((inner, cols))
    mx.eval(a @ b)
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            mx.eval(a @ b)
        best = max(best, 2 * rows * inner * cols * repeats / (time.perf_counter() - start) / 1e9)
    return best


def linear_macs(module, lora: bool = True) -> int:
    """Multiply-adds per token of every linear layer (LoRA's two factors included, unless not `lora`) under
    `module`."""
    import mlx.nn as nn

    total = 0
    for _, m in module.named_modules():
        if isinstance(m, nn.QuantizedLinear):
            total += m.weight.shape[0] * m.weight.shape[1] * 32 // m.bits
        elif isinstance(m, nn.Linear):
            total += m.weight.size
        if lora and hasattr(m, "lora_a"):
            total += m.lora_a.size + m.lora_b.size
    return total


def main() -> None:
    reexec_for_linux_cpu()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:gemma-3-270m")
    ap.add_argument("--adapter", default=str(ROOT / "adapters" / "gemma-3-270m-wordle"))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    args = ap.parse_args()

    from wordle_mlx.runtime.blas import describe_blas
    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.state import GameState
    from wordle_mlx.llm.play.generation import BatchedGenerator, SamplingConfig
    from wordle_mlx.llm.model.logits import text_model
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.model.packed import fold_lora
    from wordle_mlx.llm.play.rollout import RolloutConfig, prompt_token_ids

    model, tokenizer = load_model(args.model, adapter_path=args.adapter)
    model.eval()
    body = text_model(model).model
    hidden, vocab = body.args.hidden_size, body.args.vocab_size
    body_macs = sum(linear_macs(layer) for layer in body.layers)
    grammar_macs = sum(linear_macs(layer, lora=not fold_lora(model)) for layer in body.layers)
    head_macs = hidden * vocab
    cfg = RolloutConfig().for_adapter(args.adapter)
    openers = ["raise", "clout", "denim", "pygmy"]
    words = split_words("test")
    prompts = [prompt_token_ids(tokenizer, cfg, GameState(w, [o for o in openers[:i % 3] if o != w]))
               for i, w in enumerate(words[:max(args.batches)])]
    before = matmul_gflops(512, hidden, 4 * hidden)
    runs = []
    greedy = SamplingConfig(temperature=0.0, max_tokens_per_turn=cfg.max_tokens_per_turn)
    for mode in ("free", "grammar"):
        generate = BatchedGenerator(model, tokenizer, mode=mode)
        # first-call costs out of the way: a process's first call at the largest batch also grows the heap to
        # its size (0.6-0.7 s of a 2.7 s grammar call at 64 boards), which its later calls do not pay
        generate(prompts[:max(args.batches)], greedy.model_copy(update={"completion_batch_size": max(args.batches)}))
        for b in args.batches:
            batch = prompts[:b]
            before_tokens = generate.prefilled_tokens
            start = time.perf_counter()
            replies = generate(batch, greedy.model_copy(update={"completion_batch_size": max(b, 1)}))
            s = time.perf_counter() - start
            prefilled = generate.prefilled_tokens - before_tokens
            decoded = sum(len(r.tokens) if r.choice is None else sum(r.choice) for r in replies)
            if mode == "free":
                flops = 2 * (prefilled + decoded) * body_macs + 2 * decoded * head_macs
            else:   # the 5th letter feeds nothing; a letter and its forced separator run as one step
                stepped = len(replies) * 4 * (1 + len(generate.grammar.sep))
                flops = 2 * (prefilled + stepped) * grammar_macs + 2 * decoded * 26 * hidden
            runs.append((mode, b, s, decoded, flops))
    after = matmul_gflops(512, hidden, 4 * hidden)
    gflops = max(before, after)
    print(f"{args.model} + {Path(args.adapter).name}, BLAS: {describe_blas()}")
    print(f"per token: body {2 * body_macs / 1e6:.0f} MFLOP ({2 * grammar_macs / 1e6:.0f} in grammar decoding), "
          f"head {2 * head_macs / 1e6:.0f} MFLOP (hidden {hidden} x vocabulary {vocab}); float32 matmul measured "
          f"{gflops:.0f} GFLOP/s (512 x {hidden} x {4 * hidden}; {before:.0f} before the decoding, {after:.0f} "
          f"after)")
    print(f"{'mode':8s} {'batch':>5s} {'seconds':>8s} {'replies/s':>10s} {'tokens/s':>9s} {'roofline replies/s':>19s}")
    seconds, fraction = {}, {}
    for mode, b, s, decoded, flops in runs:
        roof = b / (flops / (gflops * 1e9))
        seconds[(mode, b)] = s
        fraction[(mode, b)] = (b / s) / roof
        print(f"{mode:8s} {b:5d} {s:8.2f} {b / s:10.2f} {decoded / s:9.1f} {roof:19.2f}")
    if (("free", 32) in seconds) and (("grammar", 32) in seconds):
        print(f"grammar_speedup {seconds[('free', 32)] / seconds[('grammar', 32)]:.2f}")
    if ("grammar", 64) in fraction:
        print(f"roofline_fraction {fraction[('grammar', 64)]:.2f}")


if __name__ == "__main__":
    main()

"""Where one grammar-decoding call spends its time: the prefill (the shared start and the boards), the letter steps.

The shipped adapter replies greedily to 64 letters-format boards (test words, 0-2 earlier guesses, as
`decode_roofline.py`) in one `BatchedGenerator` call in grammar decoding. The call's parts are timed by wrapping
the decoder's model calls (each evaluated before its clock stops): `packed_prefill` (the shared start and every
board's remainder in one packed stream) and `_step` (one letter position for every row);
the rest of the call (the 26-row head, masks, picks, buffers, Python) is what is left. Each part is printed with
its seconds, its share of the call, the matmul FLOPs its tokens need through the body's linear layers (LoRA
included unless the decoder folds it into the weights, as `decode_roofline.py` counts them) and the rate that
gives, as a fraction of the float32 matmul rate measured in the same run (512 x hidden x 4 hidden, the best of 5
rounds): each part's own roofline fraction. Then the prompt tokens run
and last `prefill_share X.XX` (the prefill over the call).
Usage: python benchmarks/decode_profile.py [--adapter adapters/gemma-3-270m-wordle] [--batch 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


def main() -> None:
    reexec_for_linux_cpu()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:gemma-3-270m")
    ap.add_argument("--adapter", default=str(ROOT / "adapters" / "gemma-3-270m-wordle"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import mlx.core as mx

    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.state import GameState
    from wordle_mlx.llm.model.logits import text_model
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.model.packed import fold_lora
    from wordle_mlx.llm.play import letter_decoder
    from wordle_mlx.llm.play.generation import BatchedGenerator, SamplingConfig
    from wordle_mlx.llm.play.rollout import RolloutConfig, prompt_token_ids

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from decode_roofline import linear_macs, matmul_gflops

    model, tokenizer = load_model(args.model, adapter_path=args.adapter)
    model.eval()
    body = text_model(model).model
    body_flops = 2 * sum(linear_macs(layer, lora=not fold_lora(model)) for layer in body.layers)   # per token
    cfg = RolloutConfig().for_adapter(args.adapter)
    openers = ["raise", "clout", "denim", "pygmy"]
    prompts = [prompt_token_ids(tokenizer, cfg, GameState(w, [o for o in openers[:i % 3] if o != w]))
               for i, w in enumerate(split_words("test")[:args.batch])]
    names = ("prefill: the start and the boards, packed", "letter steps")
    parts = {k: 0.0 for k in names}
    tokens = {k: 0 for k in names}
    originals = {"packed_prefill": letter_decoder.packed_prefill, "_step": letter_decoder._step}

    def timed(name: str, original, count):
        def call(*a, **k):
            start = time.perf_counter()
            out = original(*a, **k)
            mx.eval(out)
            parts[name] += time.perf_counter() - start
            tokens[name] += count(*a)
            return out
        return call

    letter_decoder.packed_prefill = timed(names[0], originals["packed_prefill"],
                                          lambda m, segments, prefix_kv, shared, start=None:
                                          sum(len(s) for s in segments) + (len(start) if start else 0))
    letter_decoder._step = timed("letter steps", originals["_step"], lambda m, inputs, *a: inputs.size)
    generate = BatchedGenerator(model, tokenizer, mode="grammar")
    greedy = SamplingConfig(completion_batch_size=args.batch)
    generate(prompts[:2], greedy)                      # first-call costs out of the way
    gflops = matmul_gflops(512, body.args.hidden_size, 4 * body.args.hidden_size)
    total = 0.0
    for _ in range(args.repeats):
        for k in names:
            parts[k], tokens[k] = 0.0, 0
        before = generate.prefilled_tokens
        start = time.perf_counter()
        generate(prompts, greedy)
        total = time.perf_counter() - start
        ran = generate.prefilled_tokens - before
    print(f"{args.batch} boards, one grammar-decoding call: {total:.2f} s; float32 matmul measured {gflops:.0f} "
          f"GFLOP/s (512 x {body.args.hidden_size} x {4 * body.args.hidden_size})")
    print(f"  {'part':42s} {'seconds':>7s} {'share':>6s} {'tokens':>7s} {'GFLOP':>7s} {'GFLOP/s':>8s} "
          f"{'of matmul':>9s}")
    rest = total - sum(parts.values())
    for name in names:
        s, flops = parts[name], tokens[name] * body_flops / 1e9
        rate = flops / s if s > 0 else 0.0
        print(f"  {name:42s} {s:7.2f} {s / total:6.1%} {tokens[name]:7d} {flops:7.1f} {rate:8.1f} {rate / gflops:9.2f}")
    print(f"  {'the rest (head rows, masks, picks, buffers)':42s} {rest:7.2f} {rest / total:6.1%}")
    print(f"prompt tokens run {ran} (no padding)")
    print(f"prefill_share {parts[names[0]] / total:.2f}")


if __name__ == "__main__":
    main()

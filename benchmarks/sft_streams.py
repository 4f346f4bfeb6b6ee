"""Can one process use both CPU cores better by splitting an SFT batch over two MLX CPU streams?

MLX's CPU backend runs element-wise work (the 262k-vocabulary logsumexp, norms, softmax) on one thread per
stream; only the matmuls are threaded (OpenBLAS). This times one LoRA gradient of the 270M model on a batch
of 16 self-choice examples (shared prefix, as the SFT stage runs it) against the same batch as two halves of 8,
each built and differentiated under its own `mx.stream(mx.new_stream(mx.cpu))` and evaluated together, the
gradients summed. The two arms alternate on the same batches. Run it once as is (OpenBLAS on both cores) and
once with OPENBLAS_NUM_THREADS=1 (each stream's matmuls on one core). Last line: `median one X two Y speedup Z`.
Usage: python benchmarks/sft_streams.py [--data data/choice] [--steps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.blas import reexec_with_openblas  # noqa: E402


def main() -> None:
    reexec_with_openblas()
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_map

    from wordle_mlx.llm import lora
    from wordle_mlx.llm.models import load_model
    from wordle_mlx.llm.sft_loss import loss_sum, make_batch
    from wordle_mlx.stages.data import read_sft_jsonl
    from wordle_mlx.stages.sft import tokenize

    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(ROOT / "data" / "choice"))
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    batch = 16
    model, tokenizer = load_model("builtin:gemma-3-270m")
    mx.random.seed(0)
    lora.apply_lora(model, -1, lora.lora_parameters(16, 20.0, 0.0, None))
    path = Path(args.data) / "train.jsonl"
    seqs = tokenize(read_sft_jsonl(path)[: batch * (args.steps + 1)], tokenizer, path)
    groups = [seqs[i:i + batch] for i in range(0, len(seqs), batch)][: args.steps + 1]
    loss_and_grad = nn.value_and_grad(model, loss_sum)
    streams = [mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)]

    def one(group):
        b = make_batch(group, 16, 256, True)
        (s, n), g = loss_and_grad(model, b.inputs, b.positions, b.targets, b.weights, False, b.prefix)
        mx.eval(s, n, g)
        return s.item() / n.item(), g

    def two(group):
        outs = []
        for stream, half in zip(streams, (group[0::2], group[1::2])):
            b = make_batch(half, 16, 256, True)
            with mx.stream(stream):
                outs.append(loss_and_grad(model, b.inputs, b.positions, b.targets, b.weights, False, b.prefix))
        ((s1, n1), g1), ((s2, n2), g2) = outs
        g = tree_map(mx.add, g1, g2)
        mx.eval(s1, n1, s2, n2, g)
        return (s1 + s2).item() / (n1 + n2).item(), g

    model.train()
    one(groups[0]), two(groups[0])      # warm-up
    times = {"one": [], "two": []}
    for step, group in enumerate(groups[1:], start=1):
        res = {}
        for name, fn in (("one", one), ("two", two)):
            start = time.perf_counter()
            res[name] = fn(group)
            times[name].append(time.perf_counter() - start)
        diff = max(mx.abs(a - b).max().item() for (_, a), (_, b) in
                   zip(tree_flatten(res["one"][1]), tree_flatten(res["two"][1])))
        print(f"step {step}: one {times['one'][-1]:.2f}s loss {res['one'][0]:.5f} | two {times['two'][-1]:.2f}s "
              f"loss {res['two'][0]:.5f} | max gradient difference {diff:.2e}", flush=True)
    one_s, two_s = statistics.median(times["one"]), statistics.median(times["two"])
    print(f"median one {one_s:.2f} two {two_s:.2f} speedup {one_s / two_s:.2f}")


if __name__ == "__main__":
    main()

"""Plain-temperature sampling on CPU: mlx-lm's categorical sampler against `generation.inverse_cdf_sampler`.

Both draw one token per row from softmax(logprobs / T) over Gemma 3's 262,144-token vocabulary, which is
what every decoding step of a sampled rollout does (B rows = the games of the batch). The two samplers
are timed on the same random log-probabilities, alternated; a chi-square-style check compares their
token frequencies on a small vocabulary so the speed-up is not bought with a different distribution.
Last line: `speedup X.XX` (mlx-lm over ours, median seconds per call).
Usage: python benchmarks/sampler.py [--rows 64] [--vocab 262144] [--temperature 1.0] [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


def main() -> None:
    reexec_for_linux_cpu()
    import mlx.core as mx
    import numpy as np
    from mlx_lm.sample_utils import make_sampler

    from wordle_mlx.llm.play.generation import inverse_cdf_sampler

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)

    logits = mx.random.normal((args.rows, args.vocab)) * 3
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.eval(logprobs)
    samplers = {"mlx-lm categorical": make_sampler(args.temperature), "inverse CDF (ours)": inverse_cdf_sampler(args.temperature)}
    times = {name: [] for name in samplers}
    for _ in range(args.repeats):
        for name, sample in samplers.items():
            t0 = time.perf_counter()
            mx.eval(sample(logprobs))
            times[name].append(time.perf_counter() - t0)

    # same distribution: 20,000 draws over a 6-token vocabulary, both samplers
    small = mx.log(mx.array([[0.4, 0.25, 0.15, 0.1, 0.07, 0.03]] * 2000))
    freqs = {}
    for name, sample in samplers.items():
        draws = np.concatenate([np.asarray(sample(small)) for _ in range(10)])
        freqs[name] = np.bincount(draws, minlength=6) / draws.size
    print(f"{args.rows} rows x {args.vocab} vocab, temperature {args.temperature}, {args.repeats} calls each")
    for name in samplers:
        print(f"  {name:20s} median {statistics.median(times[name]) * 1000:7.1f} ms   "
              f"frequencies on p=(.4 .25 .15 .1 .07 .03): {' '.join(f'{f:.3f}' for f in freqs[name])}")
    base, ours = (statistics.median(times[n]) for n in samplers)
    print(f"speedup {base / ours:.2f}")


if __name__ == "__main__":
    main()

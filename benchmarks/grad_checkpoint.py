"""Gradient checkpointing's cost and saving: one SFT gradient step with and without `set_grad_checkpoint`
(what `model.grad_checkpoint` turns on in `wordle-mlx sft` and `wordle-mlx train`).

Each timed step is a full LoRA gradient computation (value_and_grad + eval) of the SFT loss with the shared
prefix (as the SFT stage always runs it) on the same batch, the two interleaved so machine noise hits them alike; MLX's
peak memory is reset before every step and read after it. GRPO's update runs the same blocks
(`logits.body_hidden`), so its ratio is of the same kind. The losses must agree (checkpointing recomputes,
it does not approximate). Last two lines: `memory ratio X.XX` (checkpointed peak / plain peak, medians) and
`time ratio X.XX` (checkpointed seconds / plain seconds, medians).
Usage: python benchmarks/grad_checkpoint.py [--model builtin:gemma-3-270m] [--data FOLDER] [--batch-size 8] [--steps 3]
(without --data, a solver-data folder of the right size is made in a temporary folder)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


def main() -> None:
    reexec_for_linux_cpu()
    import mlx.core as mx
    import mlx.nn as nn

    from wordle_mlx.config import validate_config
    from wordle_mlx.llm.model import lora
    from wordle_mlx.llm.model.logits import set_grad_checkpoint
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.training.sft_data import read_sft_jsonl
    from wordle_mlx.llm.training.sft_loss import loss_sum, make_batch
    from wordle_mlx.stages import data
    from wordle_mlx.stages.sft import tokenize

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin:gemma-3-270m")
    parser.add_argument("--data", default=None)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory()
    folder = Path(args.data) if args.data else Path(tmp.name) / "data"
    if args.data is None:
        data.run(validate_config({"out": str(folder), "train_examples": args.batch_size * (args.steps + 1),
                                  "valid_examples": 2, "progress": False}, data.DataConfig, "benchmark"))
    model, tokenizer = load_model(args.model)
    mx.random.seed(0)
    lora.apply_lora(model, -1, lora.lora_parameters(8, 20.0, 0.0, None))
    seqs = tokenize(read_sft_jsonl(folder / "train.jsonl"), tokenizer, folder / "train.jsonl")
    batches = [make_batch(seqs[i:i + args.batch_size], share_prefix=True)
               for i in range(0, args.batch_size * (args.steps + 1), args.batch_size)]
    grad = nn.value_and_grad(model, loss_sum)

    def step(batch, checkpoint: bool) -> tuple[float, float, float]:
        set_grad_checkpoint(model, checkpoint)
        mx.clear_cache()
        mx.reset_peak_memory()
        start = time.perf_counter()
        (s, n), g = grad(model, batch.inputs, batch.positions, batch.targets, batch.weights, False, batch.prefix)
        mx.eval(s, n, g)
        return (s / n).item(), time.perf_counter() - start, mx.get_peak_memory() / 1e9

    model.train()
    step(batches[0], False), step(batches[0], True)        # warm-up
    results = {False: [], True: []}
    print(f"model {args.model}, batch {args.batch_size} x ~{statistics.mean(b.length for b in batches) / args.batch_size:.0f}"
          f" tokens, shared prefix, {args.steps} steps each, interleaved")
    for i, batch in enumerate(batches[1:], start=1):
        losses = []
        for checkpoint in (False, True):
            loss, seconds, peak = step(batch, checkpoint)
            results[checkpoint].append((seconds, peak))
            losses.append(loss)
            print(f"step {i} {'checkpointed' if checkpoint else 'plain':>12}: loss {loss:.6f}  {seconds:.2f} s  "
                  f"peak {peak:.3f} GB")
        if abs(losses[1] - losses[0]) > 1e-5 * abs(losses[0]):
            raise SystemExit(f"losses differ: {losses}")
    median = {k: (statistics.median(s for s, _ in v), statistics.median(p for _, p in v)) for k, v in results.items()}
    for k, name in ((False, "plain"), (True, "checkpointed")):
        print(f"{name:>12}: median {median[k][0]:.2f} s, peak {median[k][1]:.3f} GB")
    print(f"memory ratio {median[True][1] / median[False][1]:.2f}")
    print(f"time ratio {median[True][0] / median[False][0]:.2f}")
    tmp.cleanup()


if __name__ == "__main__":
    main()

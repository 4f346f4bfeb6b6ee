"""Can the LoRA setup memorize a handful of SFT examples? A check of the loss and gradient path.

Takes the first N examples of an SFT jsonl (optionally only the boards whose earlier guesses are
`--history`, e.g. `raise` for the boards right after the opener), puts a fresh LoRA (the recipe's rank
16 / scale 20 unless told otherwise) or an existing adapter on the model, and trains with AdamW on
those N examples only, printing the token-mean loss and the gradient norm before clipping every step.
With `--batch-size` below N the steps take shuffled mini-batches, one pass over the N examples per
epoch, as `wordle-mlx sft` does. The loss is the stage's own (`llm/sft_loss.py`).

    python3 scripts/memorize_check.py --data data/sft-fit/valid.jsonl --history raise --n 8 --steps 28
    python3 scripts/memorize_check.py --data data/sft-fit/train.jsonl --history raise --n 152 \
        --batch-size 16 --steps 64 --adapter logs/sft-fit-270m/adapters
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from wordle_mlx.blas import reexec_with_openblas
    reexec_with_openblas()
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np
    from mlx.utils import tree_map

    from wordle_mlx.llm import lora
    from wordle_mlx.llm.models import load_model
    from wordle_mlx.llm.sft_loss import loss_sum, make_batch
    from wordle_mlx.stages.sft import tokenize

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="an SFT jsonl (train.jsonl / valid.jsonl)")
    ap.add_argument("--history", default=None, help="comma-separated earlier guesses the boards must have ('' = empty board)")
    ap.add_argument("--n", type=int, default=8, help="how many examples to memorize")
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--batch-size", type=int, default=0, help="0 = all N examples every step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--scale", type=float, default=20.0)
    ap.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (0 = none)")
    ap.add_argument("--adapter", type=Path, default=None, help="start from this adapter instead of a fresh LoRA")
    ap.add_argument("--model", default="builtin:gemma-3-270m")
    args = ap.parse_args()

    if not args.data.is_file():
        sys.exit(f"error: --data {args.data}: file not found")
    records = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    if args.history is not None:
        want = [g for g in args.history.split(",") if g]
        records = [r for r in records if r["meta"]["history"] == want and "retry_error" not in r["meta"]]
    records = records[: args.n]
    if len(records) < args.n:
        sys.exit(f"error: --data {args.data}: only {len(records)} examples match, --n is {args.n}")
    model, tokenizer = load_model(args.model)
    mx.random.seed(0)
    if args.adapter is not None:
        params = json.loads((args.adapter / "adapter_config.json").read_text())
        lora.apply_lora(model, params["num_layers"], params["lora_parameters"])
        lora.load_adapter_weights(model, args.adapter)
    else:
        lora.apply_lora(model, -1, lora.lora_parameters(args.rank, args.scale, 0.0, None))
    seqs = tokenize(records, tokenizer, args.data)
    size = args.batch_size or len(seqs)
    optimizer = optim.AdamW(learning_rate=args.lr, weight_decay=0.0)
    loss_and_grad = nn.value_and_grad(model, loss_sum)
    model.train()
    print(f"{len(seqs)} examples, batch {size}, lr {args.lr}, {'adapter ' + str(args.adapter) if args.adapter else f'fresh LoRA rank {args.rank} scale {args.scale}'}")
    print("step  loss   grad_norm")
    for step in range(args.steps):
        epoch, offset = divmod(step * size, len(seqs))
        order = np.random.default_rng([0, epoch]).permutation(len(seqs)) if size < len(seqs) else np.arange(len(seqs))
        batch = make_batch([seqs[i] for i in order[offset:offset + size]], 16)
        (total, count), grads = loss_and_grad(model, batch.inputs, batch.positions, batch.targets, batch.weights)
        grads = tree_map(lambda g: g / count, grads)
        grads, norm = optim.clip_grad_norm(grads, args.clip if args.clip > 0 else float("inf"))
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, norm)
        print(f"{step + 1:4d}  {(total / count).item():.3f}  {norm.item():9.1f}", flush=True)


if __name__ == "__main__":
    main()

"""SFT step throughput: our selected-positions loss, with and without the shared prefix, against mlx-lm's
`default_loss` on the same batches.

All three compute cross-entropy on assistant tokens only; ours runs the model body, gathers the positions
that carry loss and projects only those onto the vocabulary (`llm/training/sft_loss.py`), mlx-lm's projects
every position. "ours, shared prefix" also runs the start that every example of the batch shares (chat
markers and system line) once per batch (`make_batch(share_prefix=True)`, what the SFT stage always does).
Each timed step is a full LoRA gradient computation (value_and_grad + eval) on the same batch, the three
interleaved so machine noise hits them alike. "shared, grammar loss" is the shared-prefix step with SFT's
`decode` "grammar" (formerly `grammar_loss`): only the reply's 5 letters are targets, projected on the 26 letter rows. Tokens/s counts every real token in the batch (prompt
included, the shared prefix once per example), as mlx-lm reports it. Last three lines: `prefix speedup X.XX`
(shared against unshared ours), `grammar loss speedup X.XX` (grammar loss against the shared full-vocabulary
loss) and `speedup X.XX` (ours unshared against mlx-lm).
Without `--data`, it first writes a small SFT data folder in the recipe's format (compact prompt, letters
reply) to a temporary folder with the `data` stage, so it runs on a fresh clone with no other command first.
Usage: python benchmarks/sft_throughput.py [--model builtin:gemma-3-270m] [--data DIR] [--steps 6]
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


def make_small_data(folder: str, examples: int) -> str:
    """A small SFT data folder in the recipe's reply format, written by the `data` stage."""
    from wordle_mlx.stages import data

    prompt = {"require_think": False, "context": "summary", "style": "compact", "guess_format": "letters"}
    cfg = data.DataConfig(out=folder, train_examples=examples, valid_examples=1, think_style="none", prompt=prompt,
                          progress=False)
    data.run(cfg)
    print(f"data: {examples} examples written to {folder}")
    return folder


def main() -> None:
    reexec_for_linux_cpu()
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tuner.trainer import default_loss

    from wordle_mlx.llm.model import lora
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.training.sft_loss import letter_loss, loss_sum, make_batch
    from wordle_mlx.llm.training.sft_data import read_sft_jsonl
    from wordle_mlx.llm.play.prompts import PromptConfig
    from wordle_mlx.stages.sft import tokenize, with_boards

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin:gemma-3-270m")
    parser.add_argument("--data", default=None, help="An SFT data folder (train.jsonl); default: make one.")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()

    if args.data is None:
        args.data = make_small_data(tempfile.mkdtemp(prefix="sft-throughput-"), args.batch_size * (args.steps + 1))
    model, tokenizer = load_model(args.model)
    mx.random.seed(0)
    lora.apply_lora(model, -1, lora.lora_parameters(args.rank, 20.0, 0.0, None))
    records = read_sft_jsonl(Path(args.data) / "train.jsonl")[: args.batch_size * (args.steps + 1)]
    seqs = tokenize(records, tokenizer, Path(args.data) / "train.jsonl")
    groups = [seqs[i:i + args.batch_size] for i in range(0, len(seqs), args.batch_size)][: args.steps + 1]

    ours_grad = nn.value_and_grad(model, loss_sum)
    theirs_grad = nn.value_and_grad(model, default_loss)

    letters = letter_loss("grammar", False, tokenizer, PromptConfig(), with_boards(seqs, records), Path(args.data)).letter_ids

    def ours(group, share=False, letter_ids=None):
        b = make_batch(group, share_prefix=share, letter_ids=letter_ids)
        (s, n), g = ours_grad(model, b.inputs, b.positions, b.targets, b.weights, False, b.prefix, b.letter_ids)
        mx.eval(s, n, g)
        return (s / n).item(), b.length

    def ours_shared(group):
        return ours(group, share=True)

    def ours_grammar(group):
        return ours(group, share=True, letter_ids=letters)

    def theirs(group):
        width = 1 + 32 * ((max(len(t) for t, _ in group) + 31) // 32)   # as mlx-lm's iterate_batches pads
        arr = [[*t, *([0] * (width - len(t)))] for t, _ in group]
        lengths = mx.array([[off, len(t)] for t, off in group])
        (loss, ntoks), g = theirs_grad(model, mx.array(arr), lengths)
        mx.eval(loss, ntoks, g)
        return loss.item(), sum(len(t) for t, _ in group)

    model.train()
    ours(groups[0]), ours_shared(groups[0]), ours_grammar(groups[0]), theirs(groups[0])   # warm-up
    rates = {"ours": [], "ours, shared prefix": [], "shared, grammar loss": [], "mlx-lm default_loss": []}
    mean_len = statistics.mean(len(t) for g in groups[1:] for t, _ in g)
    print(f"model {args.model}, batch {args.batch_size} x ~{mean_len:.0f} tokens, {args.steps} steps each, interleaved")
    for step, group in enumerate(groups[1:], start=1):
        for name, fn in (("ours", ours), ("ours, shared prefix", ours_shared), ("shared, grammar loss", ours_grammar),
                         ("mlx-lm default_loss", theirs)):
            start = time.perf_counter()
            loss, tokens = fn(group)
            seconds = time.perf_counter() - start
            rates[name].append(tokens / seconds)
            print(f"step {step} {name:>20}: loss {loss:.4f}  {tokens / seconds:8.1f} tok/s  ({seconds:.2f} s)")
    print(f"peak memory {mx.get_peak_memory() / 1e9:.2f} GB")
    for name, values in rates.items():
        print(f"{name:>20}: median {statistics.median(values):.1f} tok/s")
    print(f"prefix speedup {statistics.median(rates['ours, shared prefix']) / statistics.median(rates['ours']):.2f}")
    print(f"grammar loss speedup {statistics.median(rates['shared, grammar loss']) / statistics.median(rates['ours, shared prefix']):.2f}")
    print(f"speedup {statistics.median(rates['ours']) / statistics.median(rates['mlx-lm default_loss']):.2f}")


if __name__ == "__main__":
    main()

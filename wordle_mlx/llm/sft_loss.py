"""The SFT loss: cross-entropy on assistant tokens only, projected onto the vocabulary only where it counts.

`make_batch(sequences, pad_to)` turns tokenized examples `(tokens, prompt_length)` into arrays: inputs
`tokens[:-1]` padded to a multiple of `pad_to`, the flat positions whose next token is an assistant
token (the prompt, its chat-template prefix and the padding are masked out), those next tokens, and a
weight per position (0 for the few padding positions that round the count up to a multiple of
`pad_to`, so batch shapes repeat). `loss_sum(model, batch)` returns the summed cross-entropy and the
number of target tokens; dividing gives the token-weighted mean, which also makes gradient
accumulation exactly equal to one big batch. With `share_prefix`, the longest start that every example of
the batch shares and that carries no target (for chat data: `<bos>`, the turn marker and the system line,
about a third of a compact-prompt example) becomes `batch.prefix`: it runs through the model once and every
example's remaining tokens attend to its keys and values (`logits.shared_prefix_logits`, with gradients),
which gives the same loss and gradient as the padded batch (tests/test_sft.py) for less work
(benchmarks/sft_throughput.py). With `letter_ids` (SFT's `grammar_loss`), only the reply's letters are targets,
each a choice among the 26 letter tokens, projected on their 26 rows: the policy grammar decoding plays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .logits import full_logits_at, has_split_head, selected_logits, shared_prefix_logits


@dataclass
class SFTBatch:
    inputs: mx.array      # (B, L) int32
    positions: mx.array   # (P,) int32 flat indices into B * L
    targets: mx.array     # (P,) int32 next tokens
    weights: mx.array     # (P,) float32, 1 for real targets, 0 for padding
    tokens: int           # number of real target tokens
    length: int           # total real tokens in the batch (prompt included), for throughput
    prefix: mx.array | None = None   # (C,) int32 tokens every example starts with; `inputs` holds what follows
    letter_ids: mx.array | None = None   # grammar loss: the 26 letter token ids; `targets` index into them


def round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def shared_start(seqs: Sequence[tuple]) -> int:
    """How many leading input tokens all of `seqs` share, stopping before the first position with a target
    and leaving every example at least one input token of its own."""
    limit = min(min(len(s[0]) - 2, max(s[1] - 1, 0)) for s in seqs)
    first = seqs[0][0]
    n = 0
    while n < limit and all(s[0][n] == first[n] for s in seqs):
        n += 1
    return n


def make_batch(sequences: Sequence[tuple], pad_to: int = 32, max_length: int | None = None,
               share_prefix: bool = False, letter_ids: Sequence[int] | None = None) -> SFTBatch:
    """Arrays for a batch of (tokens, prompt_length); see the module docstring. With `letter_ids` (the grammar
    loss) only the targets that are letter tokens are kept, as indices into `letter_ids`."""
    seqs = [(list(s[0][:max_length]) if max_length else list(s[0]), s[1]) for s in sequences]
    start = shared_start(seqs) if share_prefix else 0
    width = round_up(max(len(t) - 1 - start for t, _ in seqs), pad_to)
    inputs = np.zeros((len(seqs), width), dtype=np.int32)
    positions, targets = [], []
    for b, (tokens, offset) in enumerate(seqs):
        inputs[b, : len(tokens) - 1 - start] = tokens[start:-1]
        for j in range(max(offset - 1, 0), len(tokens) - 1):   # predicts tokens[j + 1], an assistant token
            if letter_ids is not None:
                if tokens[j + 1] not in letter_ids:
                    continue
                targets.append(letter_ids.index(tokens[j + 1]))
            else:
                targets.append(tokens[j + 1])
            positions.append(b * width + j - start)
    n = len(positions)
    if n == 0:
        raise ValueError("batch has no assistant tokens to train on")
    padded = round_up(n, pad_to)
    weights = np.zeros(padded, dtype=np.float32)
    weights[:n] = 1.0
    positions += [0] * (padded - n)
    targets += [0] * (padded - n)
    return SFTBatch(mx.array(inputs), mx.array(np.array(positions, dtype=np.int32)),
                    mx.array(np.array(targets, dtype=np.int32)), mx.array(weights), n,
                    sum(len(s[0]) for s in seqs), mx.array(seqs[0][0][:start], dtype=mx.int32) if start else None,
                    mx.array(list(letter_ids)) if letter_ids is not None else None)


def unshare(prefix: mx.array, inputs: mx.array, positions: mx.array) -> tuple[mx.array, mx.array]:
    """The padded batch a shared-prefix batch stands for: the prefix put back in front of every row."""
    b, width = inputs.shape
    c = prefix.shape[0]
    full = mx.concatenate([mx.broadcast_to(prefix[None], (b, c)), inputs], axis=1)
    return full, (positions // width) * (width + c) + positions % width + c


def loss_sum(model, inputs, positions, targets, weights, full_logits: bool = False, prefix=None, letter_ids=None):
    """(summed weighted cross-entropy over real targets, their summed weight); `prefix`: see `make_batch`; with
    `letter_ids`, the cross-entropy over those tokens only (targets index into them: the grammar loss)."""
    if prefix is not None and (full_logits or not has_split_head(model)):
        inputs, positions = unshare(prefix, inputs, positions)
        prefix = None
    if prefix is not None:
        logits = shared_prefix_logits(model, prefix, inputs, positions, letter_ids).astype(mx.float32)
    elif full_logits:
        logits = full_logits_at(model, inputs, positions).astype(mx.float32)
        logits = logits if letter_ids is None else logits[:, letter_ids]
    else:
        logits = selected_logits(model, inputs, positions, letter_ids).astype(mx.float32)
    ce = nn.losses.cross_entropy(logits, targets)
    return (ce * weights).sum(), weights.sum()


def mean_loss(model, batch: SFTBatch, full_logits: bool = False) -> mx.array:
    total, count = loss_sum(model, batch.inputs, batch.positions, batch.targets, batch.weights, full_logits,
                            batch.prefix, batch.letter_ids)
    return total / count

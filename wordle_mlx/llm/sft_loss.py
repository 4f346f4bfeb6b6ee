"""The SFT loss: cross-entropy on assistant tokens only, projected onto the vocabulary only where it counts.

`make_batch(sequences, pad_to)` turns tokenized examples `(tokens, prompt_length)` into arrays: inputs
`tokens[:-1]` padded to a multiple of `pad_to`, the flat positions whose next token is an assistant
token (the prompt, its chat-template prefix and the padding are masked out), those next tokens, and a
weight per position (0 for the few padding positions that round the count up to a multiple of
`pad_to`, so batch shapes repeat). `loss_sum(model, batch)` returns the summed cross-entropy and the
number of target tokens; dividing gives the token-weighted mean, which also makes gradient
accumulation exactly equal to one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .logits import full_logits_at, selected_logits


@dataclass
class SFTBatch:
    inputs: mx.array      # (B, L) int32
    positions: mx.array   # (P,) int32 flat indices into B * L
    targets: mx.array     # (P,) int32 next tokens
    weights: mx.array     # (P,) float32, 1 for real targets, 0 for padding
    tokens: int           # number of real target tokens
    length: int           # total real tokens in the batch (prompt included), for throughput


def round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def make_batch(sequences: Sequence[tuple[list[int], int]], pad_to: int = 32, max_length: int | None = None) -> SFTBatch:
    """Arrays for a batch of (tokens, prompt_length); see the module docstring."""
    seqs = [(list(t[:max_length]) if max_length else list(t), off) for t, off in sequences]
    width = round_up(max(len(t) - 1 for t, _ in seqs), pad_to)
    inputs = np.zeros((len(seqs), width), dtype=np.int32)
    positions, targets = [], []
    for b, (tokens, offset) in enumerate(seqs):
        inputs[b, : len(tokens) - 1] = tokens[:-1]
        for j in range(max(offset - 1, 0), len(tokens) - 1):   # predicts tokens[j + 1], an assistant token
            positions.append(b * width + j)
            targets.append(tokens[j + 1])
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
                    sum(len(t) for t, _ in seqs))


def loss_sum(model, inputs, positions, targets, weights, full_logits: bool = False):
    """(summed cross-entropy over real targets, number of real targets)."""
    gather = full_logits_at if full_logits else selected_logits
    logits = gather(model, inputs, positions).astype(mx.float32)
    ce = nn.losses.cross_entropy(logits, targets) * weights
    return ce.sum(), weights.sum()


def mean_loss(model, batch: SFTBatch, full_logits: bool = False) -> mx.array:
    total, count = loss_sum(model, batch.inputs, batch.positions, batch.targets, batch.weights, full_logits)
    return total / count

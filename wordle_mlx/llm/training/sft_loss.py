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
(benchmarks/sft_throughput.py). With `letter_ids` (SFT's `decode` "grammar"), only the reply's letters are targets,
each a choice among the 26 letter tokens, projected on their 26 rows: the policy grammar decoding plays. With a
`trie` as well (`decode` "words"), each letter's choices are only the letters that continue an allowed word that is
not on the example's board (its third element: the board's words), the policy words decoding plays. With
`train_free`, every reply token (its letters, and the tags and end token those decodings force) is also a target
over the whole vocabulary, the full loss of free decoding, added to the letters' loss: an adapter that learns the
tags alone writes `<guess>guess>guess>...` in free decoding, since its letters never had to beat the rest of the
vocabulary (0 of 200 test games in the recipe run that trained so, docs/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
import numpy as np

from ..model.cpu_kernels import cross_entropy
from ..model.logits import (full_logits_at, has_split_head, hidden_at, project, selected_logits,
                     shared_prefix_logits)
from ...errors import UserError
from ...game.words import guess_list
from ..play.reply_grammar import LETTERS, LetterGrammar, WordTrie, grammar_applies


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
    allowed: mx.array | None = None      # words loss: (P, 26) bool, the letters words decoding offers at each target
    vocab: tuple | None = None           # train_free: (positions, token ids, weights) of every reply token

    def loss_args(self) -> tuple:
        """The arguments of `loss_sum` after the model, for this batch."""
        return (self.inputs, self.positions, self.targets, self.weights, False, self.prefix, self.letter_ids,
                self.allowed, self.vocab)


class LetterLoss:
    """What the grammar and words losses need: the letter token ids, the allowed-words trie (words only) and
    whether the full loss of every reply token is added (`train_free`)."""

    def __init__(self, letter_ids: list[int], trie: WordTrie | None, train_free: bool):
        self.letter_ids, self.trie, self.train_free = letter_ids, trie, train_free


def letter_loss(decode: str, train_free: bool, tokenizer, prompt_cfg, seqs: Sequence[tuple], source
                ) -> LetterLoss | None:
    """SFT's grammar or words loss (`decode`; None for free, the full loss) for tokenized examples (tokens,
    prompt length, board words or None), after checking that every reply has exactly 5 letter tokens and, for
    the words loss, that its board is recorded and its word is allowed and off the board."""
    if decode == "free":
        return None

    if not grammar_applies(prompt_cfg):
        raise UserError(f"decode: {decode!r} needs data in guess_format 'letters' without a think block, not "
                        f"guess_format {prompt_cfg.guess_format!r} with require_think {prompt_cfg.require_think}")
    ids = LetterGrammar.for_tokenizer(tokenizer).letter_ids
    letters = set(ids)
    trie = WordTrie(guess_list()) if decode == "words" else None
    for i, (tokens, prompt_length, board) in enumerate(seqs, start=1):
        reply = [t for t in tokens[prompt_length:] if t in letters]
        if len(reply) != 5:
            raise UserError(f"{source}: record {i}: decode {decode!r} needs 5 letter tokens in the reply, found "
                            f"{len(reply)}")
        if trie is not None:
            if board is None:
                raise UserError(f"{source}: record {i}: decode 'words' needs meta.history (the board's words)")
            word = "".join(LETTERS[ids.index(t)] for t in reply)
            if word not in trie.words or word in board:
                raise UserError(f"{source}: record {i}: decode 'words': the reply {word!r} is "
                                + ("not an allowed word" if word not in trie.words else "already on the board"))
    return LetterLoss(ids, trie, train_free)


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


def padded_arrays(positions: list[int], values: list, pad_to: int) -> tuple[mx.array, mx.array, mx.array]:
    """(positions, values, weights) padded to a multiple of `pad_to` with weight-0 entries."""
    n = len(positions)
    padded = round_up(n, pad_to)
    weights = np.zeros(padded, dtype=np.float32)
    weights[:n] = 1.0
    return (mx.array(np.array(positions + [0] * (padded - n), dtype=np.int32)),
            mx.array(np.array(values + [0] * (padded - n), dtype=np.int32)), mx.array(weights))


def make_batch(sequences: Sequence[tuple], pad_to: int = 32, max_length: int | None = None,
               share_prefix: bool = False, letter_ids: Sequence[int] | None = None, trie=None,
               train_free: bool = False) -> SFTBatch:
    """Arrays for a batch of (tokens, prompt_length[, board words]); see the module docstring. With `letter_ids`
    (the grammar loss) only the targets that are letter tokens are kept, as indices into `letter_ids`; with `trie`
    (a WordTrie: the words loss) each gets the letters words decoding offers there; with `train_free` every
    assistant token is also a full-vocabulary target in `vocab`."""
    seqs = [(list(s[0][:max_length]) if max_length else list(s[0]), s[1], tuple(s[2]) if len(s) > 2 else ())
            for s in sequences]
    start = shared_start(seqs) if share_prefix else 0
    width = round_up(max(len(t) - 1 - start for t, _, _ in seqs), pad_to)
    inputs = np.zeros((len(seqs), width), dtype=np.int32)
    positions, targets, allowed, vocab_positions, vocab_targets = [], [], [], [], []
    for b, (tokens, offset, board) in enumerate(seqs):
        inputs[b, : len(tokens) - 1 - start] = tokens[start:-1]
        written = ""
        for j in range(max(offset - 1, 0), len(tokens) - 1):   # predicts tokens[j + 1], an assistant token
            if letter_ids is not None:
                if train_free:                       # every reply token, letters too, over the vocabulary
                    vocab_positions.append(b * width + j - start)
                    vocab_targets.append(tokens[j + 1])
                if tokens[j + 1] not in letter_ids:
                    continue
                index = letter_ids.index(tokens[j + 1])
                targets.append(index)
                if trie is not None:
                    allowed.append(trie.allowed(written, board))
                    if not allowed[-1][index]:
                        raise ValueError(f"letter {LETTERS[index]!r} after {written!r} spells no allowed word off the "
                                         f"board {list(board)}")
                    written += LETTERS[index]
            else:
                targets.append(tokens[j + 1])
            positions.append(b * width + j - start)
    n = len(positions)
    if n == 0:
        raise ValueError("batch has no assistant tokens to train on")
    pos, tgt, weights = padded_arrays(positions, targets, pad_to)
    mask = None
    if trie is not None:
        mask = np.ones((round_up(n, pad_to), 26), dtype=bool)
        mask[:n] = allowed
        mask = mx.array(mask)
    vocab = padded_arrays(vocab_positions, vocab_targets, pad_to) if vocab_positions else None
    return SFTBatch(inputs=mx.array(inputs), positions=pos, targets=tgt, weights=weights,
                    tokens=n + len(vocab_positions), length=sum(len(s[0]) for s in seqs),
                    prefix=mx.array(seqs[0][0][:start], dtype=mx.int32) if start else None,
                    letter_ids=mx.array(list(letter_ids)) if letter_ids is not None else None, allowed=mask, vocab=vocab)


def unshare(prefix: mx.array, inputs: mx.array, positions: mx.array) -> tuple[mx.array, mx.array]:
    """The padded batch a shared-prefix batch stands for: the prefix put back in front of every row."""
    b, width = inputs.shape
    c = prefix.shape[0]
    full = mx.concatenate([mx.broadcast_to(prefix[None], (b, c)), inputs], axis=1)
    return full, (positions // width) * (width + c) + positions % width + c


def masked_cross_entropy(logits, targets, allowed):
    """Cross-entropy of `targets` under softmax(logits) renormalised over the `allowed` entries (None: all)."""
    if allowed is None:
        return cross_entropy(logits, targets)
    masked = mx.where(allowed, logits, -mx.inf)
    return mx.logsumexp(masked, axis=-1) - mx.take_along_axis(masked, targets[:, None], axis=-1)[:, 0]


def loss_sum(model, inputs, positions, targets, weights, full_logits: bool = False, prefix=None, letter_ids=None,
             allowed=None, vocab=None):
    """(summed weighted cross-entropy over real targets, their summed weight); `prefix`: see `make_batch`; with
    `letter_ids`, the cross-entropy over those tokens only (targets index into them: the grammar loss), over the
    `allowed` ones of each row when given (the words loss); `vocab`: (positions, token ids, weights) scored over
    the whole vocabulary and added."""
    if prefix is not None and (full_logits or not has_split_head(model)):
        continuations = inputs
        inputs, positions = unshare(prefix, continuations, positions)
        if vocab is not None:
            vocab = (unshare(prefix, continuations, vocab[0])[1], *vocab[1:])
        prefix = None
    if vocab is not None:
        vocab_pos, vocab_targets, vocab_weights = vocab
        both = mx.concatenate([positions, vocab_pos])
        if full_logits or not has_split_head(model):
            logits = full_logits_at(model, inputs, both).astype(mx.float32)
            letters, vocab_logits = logits[:positions.shape[0], letter_ids], logits[positions.shape[0]:]
        else:
            hidden = hidden_at(model, inputs, both, prefix)
            letters = project(model, hidden[:positions.shape[0]], letter_ids).astype(mx.float32)
            vocab_logits = project(model, hidden[positions.shape[0]:]).astype(mx.float32)
        ce = masked_cross_entropy(letters, targets, allowed)
        vocab_ce = cross_entropy(vocab_logits, vocab_targets)
        return (ce * weights).sum() + (vocab_ce * vocab_weights).sum(), weights.sum() + vocab_weights.sum()
    if prefix is not None:
        logits = shared_prefix_logits(model, prefix, inputs, positions, letter_ids).astype(mx.float32)
    elif full_logits:
        logits = full_logits_at(model, inputs, positions).astype(mx.float32)
        logits = logits if letter_ids is None else logits[:, letter_ids]
    else:
        logits = selected_logits(model, inputs, positions, letter_ids).astype(mx.float32)
    ce = masked_cross_entropy(logits, targets, allowed)
    return (ce * weights).sum(), weights.sum()


def mean_loss(model, batch: SFTBatch, full_logits: bool = False) -> mx.array:
    args = batch.loss_args()
    total, count = loss_sum(model, *args[:4], full_logits, *args[5:])
    return total / count

"""Packing scored replies into the micro-batches of a GRPO update.

`pack_batch` right-pads `TokenSequence`s into one input array and keeps, for the model tokens only (mask 1), the
flat position, target id, rollout log-prob, the sequence's advantage and a weight; the weights make every model
token of the step count the same (`averaging_weights`, DAPO's token mean), and because they are normalised over
the whole step, micro-batches simply add their gradients. Sequences that are one shared prompt followed by one
reply each (G replies to the same board) are packed by `pack_shared_batch`: the prompt runs through the model once
and every reply attends to its keys and values (`logits.shared_prefix_logits`), which gives the same log-probs and
gradients as packing the G full sequences at a fraction of the tokens; `merge_prompt_groups` puts several
prompts' groups into one such micro-batch, so a step runs in a few large forward passes: `packed_groups` lays it
out as one token stream with no padding (`packed.packed_groups_hidden`), and the padded prompts with a key gather
per row (`logits.multi_prefix_logits`) serve gradient checkpointing. `micro_batches` cuts a step's sequences so (`max_tokens_per_microbatch` padded tokens,
`max_loss_tokens` logit rows), and `batch_arrays` turns a packed batch into the MLX arrays the loss reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
import numpy as np

from ..model.packed import ATTENTION_CHUNK, PackedGroups, attention_chunks
from ..play.episode import TokenSequence
from ..play.tokens import common_prefix_length

MIN_SHARED_START = 8        # a shorter start shared by a micro-batch's prompts is not worth a pass of its own


@dataclass
class PolicyBatch:
    """Model tokens of a set of sequences, ready for one forward pass (numpy; converted per micro-batch)."""
    inputs: np.ndarray          # (N, L) int32: tokens[:-1], right-padded
    positions: np.ndarray       # (M,) flat index into (N * L) of the position predicting each model token
    targets: np.ndarray         # (M,) the model token ids
    old_logprobs: np.ndarray    # (M,) rollout log-probs
    advantages: np.ndarray      # (M,) advantage of each token (its sequence's, or its own: `prefix_advantages`)
    weights: np.ndarray         # (M,) averaging weights; they sum to (this batch's share of) 1
    sequence: np.ndarray        # (M,) index of the sequence each token belongs to
    prefix: np.ndarray | None = None   # (Lp,) a prompt shared by every row; inputs are then the continuations
    prefix_lengths: np.ndarray | None = None   # several prompts: prefix is (P, Lp) right-padded, their lengths
    prefix_rows: np.ndarray | None = None      # and the prompt each row continues (pack_shared_batch)
    prefix_start: np.ndarray | None = None     # several prompts: the start they share, run once (prefix: the rests)
    excluded: list | None = None       # per sequence: the words on its board (words decoding's letter masks)

    @property
    def num_tokens(self) -> int:
        return int(len(self.targets))


def averaging_weights(lengths: Sequence[int]) -> list[np.ndarray]:
    """Per-token weights for sequences of model-token counts `lengths`: every token the same, summing to 1."""
    total = sum(int(n) for n in lengths)
    return [np.full(int(n), 1.0 / total if total else 0.0) for n in lengths]


def token_advantages(advantage: float, n: int) -> np.ndarray:
    """A sequence's advantage for each of its n model tokens."""
    return np.full(n, float(advantage), dtype=np.float32)


def pack_batch(sequences: Sequence[TokenSequence], advantages: Sequence, weights: Sequence[np.ndarray],
               pad_id: int = 0) -> PolicyBatch:
    """Pad `sequences` into one batch; `advantages[i]` (a number, or one per model token) and `weights[i]`
    belong to sequence i."""
    if not (len(sequences) == len(advantages) == len(weights)):
        raise ValueError("pack_batch needs one advantage and one weight array per sequence")
    width = max(len(s.tokens) for s in sequences) - 1
    inputs = np.full((len(sequences), width), pad_id, dtype=np.int32)
    pos, tgt, old, adv, wts, seq = [], [], [], [], [], []
    for i, (s, a, w) in enumerate(zip(sequences, advantages, weights)):
        if not (len(s.tokens) == len(s.mask) == len(s.logprobs)):
            raise ValueError(f"sequence {i}: tokens, mask and logprobs differ in length")
        toks = np.asarray(s.tokens, dtype=np.int32)
        inputs[i, :len(toks) - 1] = toks[:-1]
        model_at = np.flatnonzero(np.asarray(s.mask[1:]) == 1)      # input position t predicts token t + 1
        if len(model_at) != len(w):
            raise ValueError(f"sequence {i}: {len(model_at)} model tokens but {len(w)} weights")
        pos.append(i * width + model_at)
        tgt.append(toks[model_at + 1])
        old.append(np.asarray(s.logprobs, dtype=np.float32)[model_at + 1])
        adv.append(token_advantages(a, len(model_at)))
        wts.append(np.asarray(w, dtype=np.float32))
        seq.append(np.full(len(model_at), i, dtype=np.int32))
    cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa: E731
    return PolicyBatch(inputs, cat(pos, np.int64), cat(tgt, np.int32), cat(old, np.float32), cat(adv, np.float32),
                       cat(wts, np.float32), cat(seq, np.int32), excluded=[s.excluded for s in sequences])


def shared_prompt_length(seq: TokenSequence) -> int | None:
    """k when the sequence is k >= 1 prompt tokens (mask 0) followed only by model tokens (mask 1), else None."""
    mask = list(seq.mask)
    k = mask.index(1) if 1 in mask else len(mask)
    if k == 0 or k == len(mask) or any(m != 1 for m in mask[k:]):
        return None
    return k


def pack_shared_batch(sequences: Sequence[TokenSequence], advantages: Sequence,
                      weights: Sequence[np.ndarray], pad_id: int = 0) -> PolicyBatch:
    """Pack sequences that are each a prompt (mask-0 prefix) followed by a reply; sequences with the same prompt
    share it. With one prompt, `prefix` is that prompt without its last token; with several, `prefix` holds them
    right-padded (P, Lp), `prefix_lengths` their lengths and `prefix_rows` the prompt of each row; the start they
    all share (the system prompt, when at least `MIN_SHARED_START` tokens) is then `prefix_start`, run once for all
    of them, and `prefix` holds only the rests. Row i of
    `inputs` is its prompt's last token followed by reply i (right-padded), so position j of a row predicts reply
    token j."""
    if not (len(sequences) == len(advantages) == len(weights)):
        raise ValueError("pack_shared_batch needs one advantage and one weight array per sequence")
    ks = [shared_prompt_length(q) for q in sequences]
    if any(k is None for k in ks):
        raise ValueError("pack_shared_batch needs sequences that are one shared prompt followed by one reply each")
    prompts = list(dict.fromkeys(tuple(q.tokens[:k]) for q, k in zip(sequences, ks)))
    which = {p: j for j, p in enumerate(prompts)}
    width = max(len(q.tokens) - k for q, k in zip(sequences, ks))
    inputs = np.full((len(sequences), width), pad_id, dtype=np.int32)
    pos, tgt, old, adv, wts, seq, rows = [], [], [], [], [], [], []
    for i, (q, k, a, w) in enumerate(zip(sequences, ks, advantages, weights)):
        reply = np.asarray(q.tokens[k:], dtype=np.int32)
        if len(reply) != len(w):
            raise ValueError(f"sequence {i}: {len(reply)} model tokens but {len(w)} weights")
        inputs[i, 0] = q.tokens[k - 1]
        inputs[i, 1:len(reply)] = reply[:-1]
        rows.append(which[tuple(q.tokens[:k])])
        pos.append(i * width + np.arange(len(reply)))
        tgt.append(reply)
        old.append(np.asarray(q.logprobs[k:], dtype=np.float32))
        adv.append(token_advantages(a, len(reply)))
        wts.append(np.asarray(w, dtype=np.float32))
        seq.append(np.full(len(reply), i, dtype=np.int32))
    cat = lambda parts, dt: np.concatenate(parts).astype(dt)  # noqa: E731
    batch = PolicyBatch(inputs, cat(pos, np.int64), cat(tgt, np.int32), cat(old, np.float32), cat(adv, np.float32),
                        cat(wts, np.float32), cat(seq, np.int32), excluded=[q.excluded for q in sequences])
    if len(prompts) == 1:
        batch.prefix = np.asarray(prompts[0][:-1], dtype=np.int32)
    else:
        heads = [p[:-1] for p in prompts]
        start = min(common_prefix_length(heads), min(len(h) for h in heads) - 1)
        start = start if start >= MIN_SHARED_START else 0
        lengths = np.array([len(h) - start for h in heads], dtype=np.int32)
        batch.prefix = np.full((len(prompts), int(lengths.max())), pad_id, dtype=np.int32)
        for j, h in enumerate(heads):
            batch.prefix[j, :lengths[j]] = h[start:]
        batch.prefix_lengths, batch.prefix_rows = lengths, np.array(rows, dtype=np.int32)
        if start:
            batch.prefix_start = np.asarray(heads[0][:start], dtype=np.int32)
    return batch


def merge_prompt_groups(groups: Sequence[Sequence[int]], sequences: Sequence[TokenSequence], max_tokens: int,
                        max_loss_tokens: int) -> list[list[int]]:
    """Groups of `shared_prompt_groups` merged, in order, into micro-batches of several prompts: at most
    `max_loss_tokens` model tokens and `max_tokens` padded tokens (the prompts, then the replies) each, so the
    prompts and replies of a step run in a few large forward passes rather than one small one per prompt."""
    out, cur = [], []
    for g in groups:
        trial = cur + list(g)
        prompts = {tuple(sequences[i].tokens[:shared_prompt_length(sequences[i])]) for i in trial}
        replies = max(len(sequences[i].tokens) - shared_prompt_length(sequences[i]) for i in trial)
        padded = len(prompts) * max(len(p) for p in prompts) + len(trial) * replies
        loss = sum(sum(sequences[i].mask) for i in trial)
        if cur and (padded > max_tokens or loss > max_loss_tokens):
            out.append(cur)
            trial = list(g)
        cur = trial
    if cur:
        out.append(cur)
    return out


def shared_prompt_groups(sequences: Sequence[TokenSequence], max_loss_tokens: int) -> tuple[list[list[int]], list[int]]:
    """(groups of indices of >= 2 sequences that share a prompt and can go through `pack_shared_batch`, each
    with at most `max_loss_tokens` model tokens; the indices of the other sequences)."""
    by_prompt: dict[tuple, list[int]] = {}
    rest = []
    for i, q in enumerate(sequences):
        k = shared_prompt_length(q)
        if k is None:
            rest.append(i)
        else:
            by_prompt.setdefault(tuple(q.tokens[:k]), []).append(i)
    groups = []
    for idx in by_prompt.values():
        if len(idx) < 2:
            rest.extend(idx)
            continue
        cur, cur_loss = [], 0
        for i in idx:
            n = sum(sequences[i].mask)
            if cur and cur_loss + n > max_loss_tokens:
                groups.append(cur)
                cur, cur_loss = [], 0
            cur.append(i)
            cur_loss += n
        groups.append(cur)
    return groups, sorted(rest)


def split_batch(sequences: Sequence[TokenSequence], max_tokens: int, max_loss_tokens: int | None = None) -> list[list[int]]:
    """Indices of sequences grouped into micro-batches (>= 1 sequence each) of at most `max_tokens` padded
    tokens and `max_loss_tokens` model tokens: each model token costs a (vocab,) row of logits, which for
    Gemma's 262k vocabulary is 1 MB in float32, several times over in the backward pass."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].tokens))
    out, cur, cur_max, cur_loss = [], [], 0, 0
    for i in order:
        n, k = len(sequences[i].tokens), sum(sequences[i].mask)
        if cur and (max(cur_max, n) * (len(cur) + 1) > max_tokens
                    or (max_loss_tokens is not None and cur_loss + k > max_loss_tokens)):
            out.append(cur)
            cur, cur_max, cur_loss = [], 0, 0
        cur.append(i)
        cur_max = max(cur_max, n)
        cur_loss += k
    if cur:
        out.append(cur)
    return out


def micro_batches(seqs: Sequence[TokenSequence], share_prompts: bool, max_tokens_per_microbatch: int,
                  max_loss_tokens: int) -> list[tuple[list[int], object]]:
    """(sequence indices, packing function) per micro-batch: the replies to one board together with their prompt
    run once (`pack_shared_batch`, merged across boards) when `share_prompts`, the others padded
    (`pack_batch`)."""
    shared, rest = shared_prompt_groups(seqs, max_loss_tokens) if share_prompts else ([], list(range(len(seqs))))
    shared = merge_prompt_groups(shared, seqs, max_tokens_per_microbatch, max_loss_tokens)
    plain = [[rest[j] for j in idx] for idx in split_batch([seqs[i] for i in rest], max_tokens_per_microbatch,
                                                           max_loss_tokens)] if rest else []
    return [(g, pack_shared_batch) for g in shared] + [(g, pack_batch) for g in plain]


def packed_groups(batch: PolicyBatch, limit: int = ATTENTION_CHUNK) -> PackedGroups:
    """A `pack_shared_batch` micro-batch of several prompts as one stream (`packed.PackedGroups`): the shared start,
    then each prompt's rest followed by its rows (each row's real tokens only: the prompt's last token and the reply
    before its last token); `gather` maps each flat position of `batch.positions` into the stream."""
    start = np.zeros(0, np.int32) if batch.prefix_start is None else np.asarray(batch.prefix_start, np.int32)
    s, width = len(start), batch.inputs.shape[1]
    rows_of = batch.positions // width
    lengths = np.bincount(rows_of, minlength=len(batch.inputs))          # each row's real tokens
    tokens, pos, group, seg = [start], [np.arange(s)], [np.full(s, -1)], [np.zeros(s, np.int64)]
    offset, sizes, at = np.zeros(len(batch.inputs), np.int64), [], s
    for p, rest_len in enumerate(batch.prefix_lengths):
        rest = np.asarray(batch.prefix[p, :rest_len], np.int32)
        base, first = s + len(rest), at
        tokens.append(rest), pos.append(s + np.arange(len(rest))), group.append(np.full(len(rest), p))
        seg.append(np.zeros(len(rest), np.int64))
        at += len(rest)
        for i in np.flatnonzero(batch.prefix_rows == p):
            n = int(lengths[i])
            tokens.append(batch.inputs[i, :n]), pos.append(base + np.arange(n)), group.append(np.full(n, p))
            seg.append(np.full(n, 1 + i))
            offset[i] = at
            at += n
        sizes.append(at - first)
    chunks = [(s + lo, s + hi) for lo, hi in attention_chunks(sizes, limit)]
    cat = lambda parts: np.concatenate(parts).astype(np.int32)          # noqa: E731
    gather = offset[rows_of] + batch.positions % width
    return PackedGroups(cat(tokens), cat(pos), cat(group), cat(seg), s, chunks, gather.astype(np.int32))


def choice_arrays(letters, targets: np.ndarray, sequence: np.ndarray, excluded=None) -> dict:
    """What `selected_logprobs` needs to score letter choices: the letter token ids, each target's index among
    them and the letters allowed at its position (in words decoding, off each sequence's `excluded` words)."""

    index, allowed = letters.masks(targets, sequence, excluded)
    return {"ids": mx.array(letters.grammar.letter_ids), "index": mx.array(index),
            "allowed": None if allowed.all() else mx.array(allowed)}


def batch_arrays(batch: PolicyBatch, letters=None) -> dict:
    """The micro-batch as MLX arrays; with `letters` (a LetterChoices), the targets are scored as letter choices."""

    arrays = {"inputs": mx.array(batch.inputs), "positions": mx.array(batch.positions.astype(np.int32)),
              "targets": mx.array(batch.targets), "adv": mx.array(batch.advantages),
              "weights": mx.array(batch.weights)}
    if batch.prefix_rows is not None:
        arrays["packed"] = packed_groups(batch)            # the prompts and replies in one stream (packed.py)
        arrays["prefix"] = (mx.array(batch.prefix), mx.array(batch.prefix_lengths), mx.array(batch.prefix_rows))
        if batch.prefix_start is not None:
            arrays["prefix"] += (mx.array(batch.prefix_start),)
    elif batch.prefix is not None:
        arrays["prefix"] = mx.array(batch.prefix)
    if letters is not None:
        arrays["choices"] = choice_arrays(letters, batch.targets, batch.sequence, batch.excluded)
    return arrays

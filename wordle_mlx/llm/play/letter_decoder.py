"""Lockstep decoding of letters-format replies: the prompts run once, then 5 letters are picked on 26 rows.

In grammar and words decoding (reply_grammar.py) every reply has the same shape, so all rows decode in lockstep
and nothing needs continuous batching. `decode_letters(model, grammar, prompts, pick, batch_size)`:
1. the longest start shared by every prompt (the system prompt) runs through the model once, at batch 1;
2. each distinct prompt's remainder (the board, then the forced opening tag) runs once, right-padded, attending
   to that shared start's keys and values (`logits.body_hidden`, as training's shared-prefix path); rows that
   repeat a prompt (G samples of one board) share its keys and values;
3. at each letter, the final hidden state of each row is multiplied by the 26 letter rows of the output
   projection only, `pick(logits (B, 26), letters so far)` chooses the letters and their log-probs (greedy,
   sampling, the words mask: generation.py), and the chosen letters (and any forced separator) run through the
   model as one more position per row, with per-row positions (RoPE offsets) and a mask that hides the padding.
Four such steps after the prompt give the 5 letters. Gemma 3 text models only (`logits.has_split_head`); the
result is the full model's distribution at each letter, renormalised over the letters (tests/test_grammar.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

import mlx.core as mx
import numpy as np

from ..model.logits import body_hidden, head_rows, text_model
from .reply_grammar import LetterGrammar
from .tokens import common_prefix_length

Pick = Callable[[mx.array, list[list[int]], list[int]], tuple[list[int], list[float]]]


class _StepKV:
    """The keys/values one block sees in a decoding step: everything before this step (given), then this
    step's own, which it keeps. `offset` holds each row's position of the step's first token (RoPE)."""

    def __init__(self, past: list[tuple[mx.array, mx.array]], offset: mx.array):
        self.past, self.offset = past, offset
        self.keys = self.values = None

    def update_and_fetch(self, keys, values):
        self.keys, self.values = keys, values
        return (mx.concatenate([k for k, _ in self.past] + [keys], axis=2),
                mx.concatenate([v for _, v in self.past] + [values], axis=2))


def _step(model, inputs: mx.array, past: list[list[tuple[mx.array, mx.array]]], key_pos: mx.array,
          query_pos: mx.array) -> tuple[mx.array, list[tuple[mx.array, mx.array]]]:
    """Run `inputs` (B, Lq) at positions `query_pos` (B, Lq) after the keys in `past` (per block, a list of (B, kvh,
    T, d) parts) whose positions are `key_pos` (B, T; -1 = padding, never attended). Returns the final-normed hidden
    state of each row's last position and the step's own keys/values per block."""
    body = text_model(model).model
    h = body.embed_tokens(inputs)
    h = h * mx.array(body.args.hidden_size ** 0.5, mx.bfloat16).astype(h.dtype)
    keys = mx.concatenate([key_pos, query_pos], axis=1)[:, None, None, :]            # (B, 1, 1, T + Lq)
    valid = keys >= 0
    q = query_pos[:, None, :, None]                                                  # (B, 1, Lq, 1)
    causal = valid & (keys <= q)
    sliding = causal & (q - keys < body.window_size)
    pattern = body.sliding_window_pattern
    own = []
    for i, layer in enumerate(body.layers):
        kv = _StepKV(past[i], query_pos[:, 0])
        h = layer(h, causal if i % pattern == pattern - 1 else sliding, kv)
        own.append((kv.keys, kv.values))
    return body.norm(h[:, -1, :]), own


def decode_letters(model, grammar: LetterGrammar, prompts: Sequence[Sequence[int]], pick: Pick,
                   batch_size: int = 64) -> tuple[list[list[int]], list[list[float]], int]:
    """(letter indices, their log-probs, prompt tokens run through the model) for each prompt, which must already
    end with the reply's forced opening (`grammar.open + grammar.sep`). `pick(logits, letters, rows)` gets the
    (B, 26) letter logits of the rows `rows` (indices into `prompts`) and their letters so far, and returns one
    letter index and one log-prob per row."""
    prompts = [list(p) for p in prompts]
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    shared = min(common_prefix_length(distinct), min(len(p) for p in distinct) - 1)
    prefix_kv = None
    ran = shared
    if shared:
        _, prefix_kv = body_hidden(model, mx.array(distinct[0][:shared])[None], keep_kv=True)
        mx.eval(prefix_kv)
    rows_of_prompt: dict[tuple, list[int]] = {}
    for i, p in enumerate(prompts):
        rows_of_prompt.setdefault(tuple(p), []).append(i)
    order = [i for p in distinct for i in rows_of_prompt[p]]       # rows of one prompt side by side
    letters: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[float]] = [[] for _ in prompts]
    rows_w = head_rows(model, mx.array(grammar.letter_ids)).T
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        ran += _decode_chunk(model, grammar, [prompts[i] for i in rows], rows, shared, prefix_kv, rows_w, pick,
                             letters, logprobs)
    return letters, logprobs, ran


def _decode_chunk(model, grammar, prompts, rows, shared, prefix_kv, rows_w, pick, letters, logprobs) -> int:
    """Decode one chunk of rows (see decode_letters); returns the prompt tokens it ran."""
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    row_prompt = [distinct.index(tuple(p)) for p in prompts]      # each row's distinct prompt
    which = mx.array(row_prompt)
    lengths = [len(p) - shared for p in distinct]
    width = max(lengths)
    rest = np.zeros((len(distinct), width), dtype=np.int32)
    for j, p in enumerate(distinct):
        rest[j, :lengths[j]] = p[shared:]
    hidden, rest_kv = body_hidden(model, mx.array(rest), prefix_kv, keep_kv=True)
    last = hidden[mx.arange(len(distinct)), mx.array(lengths) - 1]
    # per block: the shared start (broadcast), then each row's own prompt remainder
    b = len(prompts)
    past = []
    for i, (k, v) in enumerate(rest_kv):
        parts = [(k[which], v[which])]
        if prefix_kv is not None:
            pk, pv = prefix_kv[i]
            parts.insert(0, (mx.broadcast_to(pk, (b,) + pk.shape[1:]), mx.broadcast_to(pv, (b,) + pv.shape[1:])))
        past.append(parts)
    n = np.array([lengths[j] for j in row_prompt])
    key_pos = np.concatenate([np.tile(np.arange(shared), (b, 1)),
                              np.where(np.arange(width)[None] < n[:, None], shared + np.arange(width)[None], -1)],
                             axis=1).astype(np.int32)
    next_pos = shared + n
    h = last[which]
    step_len = 1 + len(grammar.sep)
    for t in range(5):
        logits = (h @ rows_w).astype(mx.float32)
        chosen, values = pick(logits, [letters[r] for r in rows], rows)
        for r, c, v in zip(rows, chosen, values):
            letters[r].append(int(c))
            logprobs[r].append(float(v))
        if t == 4:
            break
        ids = np.array([[grammar.letter_ids[c]] + grammar.sep for c in chosen], dtype=np.int32)
        query_pos = (next_pos[:, None] + np.arange(step_len)[None]).astype(np.int32)
        h, own = _step(model, mx.array(ids), past, mx.array(key_pos), mx.array(query_pos))
        for i, kv in enumerate(own):
            past[i].append(kv)
        key_pos = np.concatenate([key_pos, query_pos], axis=1)
        next_pos = next_pos + step_len
    return int(sum(lengths))

"""Lockstep decoding of letters-format replies: the prompts run once, then 5 letters are picked on 26 rows.

In grammar and words decoding (reply_grammar.py) every reply has the same shape, so all rows decode in lockstep
and nothing needs continuous batching. `decode_letters(model, grammar, prompts, policy, batch_size)`:
1. the longest start shared by every prompt (the system prompt) runs once, and each distinct prompt's remainder
   (the board, then the forced opening tag) runs once, attending to that shared start's keys and values: the start
   and all remainders end to end as one packed token stream with no padding (`packed.packed_prefill`), so the
   blocks' matmuls see every board's tokens at once; rows that repeat a prompt (G samples of one board) share its
   keys and values, and further chunks of rows reuse the start's;
2. each block gets one key/value buffer for all rows, gathered in one step from the shared start's and the
   stream's keys and values: the shared start, the row's prompt remainder, and a free slot for each letter to come;
3. at each letter, the final hidden state of each row is multiplied by the 26 letter rows of the output
   projection only. The policy (`LetterPolicy`) masks the letters (grammar: none; words: the letters that continue
   an allowed word off the row's board, from `WordTrie.table()` on the device), picks them (greedy, or sampled by
   inverse CDF from one uniform a row) and scores them, all on the device; the chosen letters (and any forced
   separator) run through the model as one more position per row, with per-row positions (RoPE offsets), writing
   their keys and values into the buffers' next slot (each block as `packed.block`: the LoRA products that read the
   same input merged). One evaluation a letter, and no per-row Python; the trie's tables go to the device once.
Four such steps after the prompt give the 5 letters. Gemma 3 text models only (`logits.has_split_head`); the
result is the full model's distribution at each letter, renormalised over the allowed letters (tests/test_grammar.py).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Collection, Sequence

import mlx.core as mx
import numpy as np

from ..model.logits import embed, head_rows, text_model
from ..model.packed import Rotation, block, fold_lora, grouped_attention, packed_prefill, projections, rotations
from .reply_grammar import LetterGrammar, WordTrie
from .tokens import common_prefix_length


@dataclass
class LetterPolicy:
    """How letters are picked for each of N prompts: greedily where `greedy`, else sampled from
    softmax(logits / temperature) over the allowed letters; each pick's log-prob is recorded at
    `logprob_temperature`. With a `trie` (words decoding) only letters that continue one of its words are
    allowed, and never into a word in `excluded` (each prompt's words on the board)."""
    temperature: float
    greedy: np.ndarray                    # (N,) bool
    logprob_temperature: np.ndarray       # (N,) float32
    trie: WordTrie | None = None
    excluded: Sequence[Collection[str]] | None = None


class _SlotKV:
    """The keys/values one block sees in a decoding step: its buffer (B, kv heads, T, d), into whose `slot` the
    step writes its own. `rotate` is RoPE at the step's positions (`packed.Rotation`)."""

    def __init__(self, buffer: list[mx.array], slot: int, rotate: Rotation):
        self.buffer, self.slot, self.rotate = buffer, slot, rotate

    def update_and_fetch(self, keys, values):
        k, v = self.buffer
        k[..., self.slot:self.slot + keys.shape[2], :] = keys
        v[..., self.slot:self.slot + values.shape[2], :] = values
        self.buffer[0], self.buffer[1] = k, v
        return k, v


def _slot_attention(attn, x: mx.array, mask: mx.array, kv: _SlotKV, folded: bool) -> mx.array:
    """Gemma 3's attention (`gemma3_text.Attention.__call__`) of a step's positions against the block's buffer, its
    linear layers through `packed.projections` (`folded` as there)."""
    b, n, _ = x.shape
    q, k, v = projections(x, [attn.q_proj, attn.k_proj, attn.v_proj], folded)
    q = attn.q_norm(q.reshape(b, n, attn.n_heads, -1).transpose(0, 2, 1, 3))
    k = attn.k_norm(k.reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3))
    v = v.reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    k, v = kv.update_and_fetch(kv.rotate(k), v)
    out = grouped_attention(kv.rotate(q), k, v, attn.scale, mask)
    return projections(out.transpose(0, 2, 1, 3).reshape(b, n, -1), [attn.o_proj], folded)[0]


def _step(model, inputs: mx.array, buffers: list[list[mx.array]], key_pos: mx.array, query_pos: np.ndarray,
          slot: int, folded: bool = False) -> mx.array:
    """Run `inputs` (B, Lq) at positions `query_pos` (B, Lq), writing their keys/values at `slot` of each block's
    buffer; `key_pos` (B, T) is the position of every buffer slot (-1: padding or not yet written, never attended).
    Returns the final-normed hidden state of each row's last position; `folded` as in `packed.projections`."""
    body = text_model(model).model
    h = embed(body, inputs)
    keys = key_pos[:, None, None, :]                                                  # (B, 1, 1, T)
    q = mx.array(query_pos)[:, None, :, None]                                        # (B, 1, Lq, 1)
    causal = (keys >= 0) & (keys <= q)
    sliding = causal & (q - keys < body.window_size)
    pattern = body.sliding_window_pattern
    rotate = rotations(body, query_pos, 1)
    for i, layer in enumerate(body.layers):
        glob = i % pattern == pattern - 1
        mask, kv = causal if glob else sliding, _SlotKV(buffers[i], slot, rotate[glob])
        h = block(layer, h, lambda attn, x, mask=mask, kv=kv: _slot_attention(attn, x, mask, kv, folded),
                  inference=True, folded=folded)
    return body.norm(h[:, -1, :])


class _Picker:
    """A chunk's letter picks on the device (see LetterPolicy); in words decoding it walks each row's trie node."""

    def __init__(self, policy: LetterPolicy, rows: np.ndarray, words: tuple[mx.array, mx.array] | None):
        self.temperature = policy.temperature
        self.greedy = policy.greedy[rows]
        self.greedy_mx = mx.array(self.greedy)
        self.at = mx.array(policy.logprob_temperature[rows].astype(np.float32))[:, None]
        self.words = words
        if words is not None:
            boards = [policy.excluded[r] if policy.excluded is not None else () for r in rows]
            width = max([len(set(b)) for b in boards] + [1])
            paths = np.full((len(rows), width, 6), -1, dtype=np.int32)
            for j, board in enumerate(boards):
                for e, word in enumerate(sorted(set(board))):
                    paths[j, e] = policy.trie.path(word)
            self.paths = mx.array(paths)
            self.node = mx.zeros((len(rows),), dtype=mx.int32)

    def __call__(self, logits: mx.array, t: int) -> tuple[mx.array, mx.array]:
        """(letter index (B,), its log-prob (B,)) at letter `t` from the (B, 26) float32 logits."""
        if self.words is not None:
            child, count = self.words
            cand = child[self.node]                                                   # (B, 26) next nodes
            gone = (self.paths[:, :, t + 1, None] == cand[:, None, :]).sum(axis=1)    # board words under each
            allowed = (cand >= 0) & (count[mx.maximum(cand, 0)] > gone)
            logits = mx.where(allowed, logits, -mx.inf)
        chosen = mx.argmax(logits, axis=-1)
        if self.temperature > 0 and not self.greedy.all():
            u = mx.random.uniform(shape=(logits.shape[0], 1))
            x = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)) / self.temperature
            cdf = mx.cumsum(mx.exp(x - x.max(axis=-1, keepdims=True)), axis=-1)
            drawn = mx.minimum((cdf < u * cdf[:, -1:]).sum(axis=-1), logits.shape[-1] - 1)
            chosen = mx.where(self.greedy_mx, chosen, drawn)
        chosen = chosen.astype(mx.int32)
        scaled = logits / self.at
        value = mx.take_along_axis(scaled, chosen[:, None], axis=-1)[:, 0] - mx.logsumexp(scaled, axis=-1)
        if self.words is not None:
            self.node = mx.take_along_axis(cand, chosen[:, None], axis=-1)[:, 0]
        return chosen, value


_DEVICE_TABLES: "weakref.WeakKeyDictionary[WordTrie, tuple[mx.array, mx.array]]" = weakref.WeakKeyDictionary()


def _device_table(trie: WordTrie) -> tuple[mx.array, mx.array]:
    """`trie.table()` as MLX arrays, made once per trie (not on every decoding call)."""
    if trie not in _DEVICE_TABLES:
        child, count = trie.table()
        _DEVICE_TABLES[trie] = (mx.array(child), mx.array(count))
    return _DEVICE_TABLES[trie]


def decode_letters(model, grammar: LetterGrammar, prompts: Sequence[Sequence[int]], policy: LetterPolicy,
                   batch_size: int = 64) -> tuple[list[list[int]], list[list[float]], int]:
    """(letter indices, their log-probs, prompt tokens run through the model) for each prompt, which must already
    end with the reply's forced opening (`grammar.open + grammar.sep`); at most `batch_size` rows decode at once."""
    prompts = [list(p) for p in prompts]
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    shared = min(common_prefix_length(distinct), min(len(p) for p in distinct) - 1)
    prefix_kv, ran = None, 0            # the start's keys and values, from the first chunk's stream
    first = {p: j for j, p in enumerate(distinct)}
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), first[tuple(prompts[i])]))
    words = None if policy.trie is None else _device_table(policy.trie)
    folded = fold_lora(model)
    rows_w = head_rows(model, mx.array(grammar.letter_ids)).T
    letters = np.zeros((len(prompts), 5), dtype=np.int64)
    logprobs = np.zeros((len(prompts), 5), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        rows = np.array(order[start:start + batch_size])
        chosen, values, n, prefix_kv = _decode_chunk(model, grammar, [prompts[i] for i in rows], shared, prefix_kv,
                                                     rows_w, _Picker(policy, rows, words), folded)
        letters[rows], logprobs[rows] = chosen, values
        ran += n
    return letters.tolist(), logprobs.tolist(), ran


def _decode_chunk(model, grammar, prompts, shared, prefix_kv, rows_w, pick: _Picker, folded: bool):
    """Decode one chunk of rows, sorted by prompt length (see decode_letters): (letters (B, 5), log-probs (B, 5),
    prompt tokens run, the shared start's per-block keys and values). Without `prefix_kv` the shared start runs at
    the head of the chunk's packed stream."""
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    index = {p: j for j, p in enumerate(distinct)}
    which = np.array([index[tuple(p)] for p in prompts])
    lengths = np.array([len(p) - shared for p in distinct])
    width, b = int(lengths.max()), len(prompts)
    inline = prefix_kv is None and shared > 0
    last, kv = packed_prefill(model, [p[shared:] for p in distinct], prefix_kv, shared,
                              distinct[0][:shared] if inline else None, folded=folded)
    step_len = 1 + len(grammar.sep)
    free = 4 * step_len                                  # a slot for each letter but the last, and its separator
    n, starts = lengths[which], (np.cumsum(lengths) - lengths)[which]
    # each row's buffer gathered from [the shared start, the packed stream, one zero slot]: its own remainder, then
    # zeros where it is shorter than the longest and in the letters' free slots
    zero = shared + int(lengths.sum())
    gather = np.full((b, shared + width + free), zero, dtype=np.int32)
    gather[:, :shared] = np.arange(shared)
    own = np.arange(width)[None] < n[:, None]
    gather[:, shared:shared + width] = np.where(own, shared + starts[:, None] + np.arange(width)[None], zero)
    gather = mx.array(gather.reshape(-1))
    buffers = []
    for i, (k, v) in enumerate(kv):
        pair = []
        for x, p in zip((k, v), (None, None) if prefix_kv is None else prefix_kv[i]):
            zeros = mx.zeros(x.shape[:2] + (1,) + x.shape[3:], x.dtype)
            x = mx.concatenate(([p] if p is not None else []) + [x, zeros], axis=2)[0]   # (kv heads, S + N + 1, d)
            pair.append(x[:, gather].reshape(x.shape[0], b, -1, x.shape[2]).transpose(1, 0, 2, 3))
        buffers.append(pair)
    key_pos = np.full((b, shared + width + free), -1, dtype=np.int32)
    key_pos[:, :shared] = np.arange(shared)
    key_pos[:, shared:shared + width] = np.where(np.arange(width)[None] < n[:, None], shared + np.arange(width), -1)
    key_pos = mx.array(key_pos)
    next_pos = (shared + n).astype(np.int32)
    h = last[mx.array(which)]
    mx.eval(h, buffers)
    letter_ids = mx.array(grammar.letter_ids, dtype=mx.int32)
    sep = mx.broadcast_to(mx.array(grammar.sep, dtype=mx.int32)[None], (b, len(grammar.sep)))
    chosen, values = [], []
    for t in range(5):
        c, value = pick((h @ rows_w).astype(mx.float32), t)
        chosen.append(c)
        values.append(value)
        if t == 4:
            mx.eval(chosen, values)
            break
        ids = mx.concatenate([letter_ids[c][:, None], sep], axis=1)
        query_pos = next_pos[:, None] + np.arange(step_len, dtype=np.int32)[None]
        slot = shared + width + t * step_len
        key_pos[:, slot:slot + step_len] = mx.array(query_pos)
        h = _step(model, ids, buffers, key_pos, query_pos, slot, folded=folded)
        next_pos = next_pos + step_len
        mx.eval(h, c, value, key_pos, buffers, getattr(pick, "node", c))
    if inline:                                      # the start's keys and values, for the next chunks
        prefix_kv = [(k[:, :, :shared], v[:, :, :shared]) for k, v in kv]
    ran = int(lengths.sum()) + (shared if inline else 0)
    return np.array(mx.stack(chosen, axis=1)), np.array(mx.stack(values, axis=1)), ran, prefix_kv

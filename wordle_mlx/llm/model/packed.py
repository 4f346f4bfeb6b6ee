"""A packed prefill: many prompts' remainders after one shared start, run as one token stream with no padding.

Grammar decoding runs the boards of a batch after the system prompt they share. `packed_prefill(model, segments,
prefix_kv, shared, start)` puts the shared start (when its keys are not given) and every board's remainder (a
segment) end to end into one (1, N) stream, so each block's linear layers see all N tokens in one product, and only
attention knows the segments: a token's position is the shared start's length plus its place in its own segment
(RoPE, per token), and it attends to the shared start's keys and to the tokens of its own segment up to itself
(causal, and the sliding window). Attention runs per chunk of whole consecutive segments (at most `PREFILL_CHUNK`
tokens, a segment longer than that alone), against the start's keys and the chunk's own, under an additive bias
made once per call; one bias for the whole stream would make attention cost N x N, many times the segments' own.
The block is Gemma 3's (`mlx_lm.models.gemma3_text.TransformerBlock`, `block`) with its attention's positions and
mask taken over here; the letter steps use the same block. What makes it fast on the CPU, each the same function
to float32 rounding (tests/test_fast_play.py): RoPE as a multiply-add with a cos/sin table read off the RoPE
module once a call (`Rotation`: the module evaluates sin and cos for every element of every block); the heads that
share a key head as the rows of one attention product; in float32, the chunks' attention and the GELU in numpy
(`cpu_kernels.chunk_attention`, `cpu_kernels.gated_gelu`: a few microseconds a call against MLX's dispatch of
each small op and its scalar exp and tanh); and the
linear layers through `projections`: LoRA folded into the weights (`fold_lora`, as mlx-lm's `fuse` makes them,
kept while the adapter's weights stay the same), or else one product for the LoRA down-projections that read the
same input and each delta added in one fused multiply-add. Gemma 3 text models only (`logits.has_split_head`).

The GRPO update packs the same way, with gradient (`PackedGroups`, `packed_groups_hidden`): the stream is the start
the micro-batch's prompts share, then each prompt's rest followed by its replies. A prompt's token attends to the
start and its prompt's earlier tokens; a reply's, to the start, its prompt and its own reply's earlier tokens (never
another reply's). Attention runs over the start, then per chunk of whole prompt groups against the start's keys and
the chunk's own; in training the linear layers are called as they are (their dropout may act, LoRA is not folded).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.gemma3_text import clip_residual

from ...runtime import device
from .cpu_kernels import chunk_attention, gated_gelu, numpy_inference
from .logits import embed, text_model

ATTENTION_CHUNK = 128       # stream tokens a chunk of whole segments attends over at once (see the docstring)
PREFILL_CHUNK = 32          # the prefill's: its boards' remainders are short (9-42 tokens), and on the CPU a chunk
                            # of a few of them costs less than one of many (16.6 against 23.3 ms a block for 64)


def attention_chunks(lengths: Sequence[int], limit: int = ATTENTION_CHUNK) -> list[tuple[int, int]]:
    """(start, stop) stream offsets of consecutive whole segments, at most `limit` tokens each (or one segment)."""
    chunks, lo, end = [], 0, 0
    for n in lengths:
        if end > lo and end + n - lo > limit:
            chunks.append((lo, end))
            lo = end
        end += int(n)
    chunks.append((lo, end))
    return chunks


def _chunk_bias(seg: np.ndarray, pos: np.ndarray, shared: int, window: int | None) -> np.ndarray:
    """(n, shared + n) additive attention bias of one chunk: 0 where a token may attend, -inf elsewhere."""
    keys = np.concatenate([np.arange(shared), pos])
    same = np.concatenate([np.ones((len(pos), shared), dtype=bool), seg[:, None] == seg[None, :]], axis=1)
    ok = same & (keys[None, :] <= pos[:, None])
    if window is not None:
        ok &= pos[:, None] - keys[None, :] < window
    return np.where(ok, 0.0, -np.inf).astype(np.float32)


class Rotation:
    """A RoPE module's rotation at fixed positions, as multiply-adds with a cos/sin table. The table is read off the
    module itself, once for all the blocks that share it (the module rotates the probe [1 .. 1, 0 .. 0] at position
    p into [cos, sin] at p), so the result equals the module's own call at those offsets to the bit, at a fraction
    of its cost on the CPU, where the module evaluates sin and cos for every element of every block.
    `Rotation(rope, positions, head_axis)(x)` rotates x whose shape is `positions`' (any shape, int) with a heads
    axis inserted at `head_axis`, then the head's d. Only a RoPE over the whole head in the halves layout
    (Gemma 3's `nn.RoPE`, scaled or not)."""

    def __init__(self, rope, positions: np.ndarray, head_axis: int):
        if not isinstance(rope, nn.RoPE) or rope.traditional:
            raise NotImplementedError(f"packed attention supports nn.RoPE in the halves layout, not {rope!r}")
        half = rope.dims // 2
        probe = mx.concatenate([mx.ones((1, 1, int(positions.max()) + 1, half)),
                                mx.zeros((1, 1, int(positions.max()) + 1, half))], axis=-1)
        table = mx.expand_dims(rope(probe)[0, 0][mx.array(positions)], head_axis)
        self.dims, self.cos, self.sin = rope.dims, table[..., :half], table[..., half:]

    def __call__(self, x: mx.array) -> mx.array:
        if x.shape[-1] != self.dims:
            raise NotImplementedError(f"packed attention rotates the whole head: RoPE dims {self.dims}, head "
                                      f"{x.shape[-1]}")
        return _rotate(x, self.cos, self.sin)


@mx.compile
def _rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """RoPE's rotation of x's halves by the angles whose cos and sin are given (one fused kernel, not seven)."""
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


FOLD_LIMIT_BYTES = 1 << 30   # the most a folded copy of the body's LoRA layers' weights may take (the 270M's: 0.4 GB)
_folded: dict = {"model": None, "layers": {}}


def fold_lora(model) -> bool:
    """Whether decoding with `model` on this device runs its LoRA layers folded (see `projections`), and if so
    make their folded weights ready. Folded means each layer's weight plus its LoRA delta, as mlx-lm's `fuse` makes
    it, (scale lora_b^T) lora_a^T, so one product replaces three and the delta's addition; the same sums to
    float32 rounding. Only on the CPU, for float32 layers that are not quantized (a bfloat16 or 4-bit base keeps its
    own weights), and only while the copy stays under `FOLD_LIMIT_BYTES` (the 4B's would double its memory).
    The copies are kept for one model and remade when a layer's weights change (a GRPO update), so the turns of
    a rollout share them."""
    body = text_model(model).model
    layers = [m for _, m in body.named_modules() if hasattr(m, "lora_a")]
    if (device.has_gpu() or not layers or
            not all(type(m.linear) is nn.Linear and m.linear.weight.dtype == m.lora_a.dtype == m.lora_b.dtype
                    == mx.float32 for m in layers) or
            sum(m.linear.weight.nbytes for m in layers) > FOLD_LIMIT_BYTES):
        return False
    if _folded["model"] is None or _folded["model"]() is not model:
        _folded["model"], _folded["layers"] = weakref.ref(model), {}
    ready = _folded["layers"]
    for m in layers:
        held = ready.get(id(m))
        if held is None or held[0] is not m.lora_a or held[1] is not m.lora_b or held[2] is not m.linear.weight:
            weight = m.linear.weight + ((m.scale * m.lora_b.T) @ m.lora_a.T).astype(m.linear.weight.dtype)
            ready[id(m)] = (m.lora_a, m.lora_b, m.linear.weight, weight)
    mx.eval([v[3] for v in ready.values()])
    return True


def projections(x: mx.array, modules: Sequence, folded: bool = False) -> list[mx.array]:
    """`[m(x) for m in modules]` for linear layers that read the same `x`, with fewer and larger ops. `folded`
    (after `fold_lora` said yes): each LoRA layer as one product with its folded weight. Otherwise the LoRA
    layers' down-projections (x @ lora_a) as one product, and each layer's delta added to its base output by one
    fused multiply-add (`mx.addmm`, alpha = the LoRA scale); the same sums to float32 rounding. Only for inference
    (a layer in training mode, whose dropout may act, is called as it is) and only where x, the base output and the
    LoRA weights share a dtype (a bfloat16 model keeps float32 LoRA: it is called as it is)."""
    if not all(hasattr(m, "lora_a") and not m.training and m.lora_a.dtype == x.dtype == m.lora_b.dtype
               for m in modules):
        return [m(x) for m in modules]
    if folded:
        ready = _folded["layers"]
        return [x @ ready[id(m)][3].T for m in modules]
    a = modules[0].lora_a if len(modules) == 1 else mx.concatenate([m.lora_a for m in modules], axis=1)
    z, out, at = x @ a, [], 0
    for m in modules:
        r = m.lora_a.shape[1]
        out.append(mx.addmm(m.linear(x), z[..., at:at + r] if len(modules) > 1 else z, m.lora_b, alpha=m.scale))
        at += r
    return out


def block(layer, h: mx.array, attention, inference: bool = False, folded: bool = False) -> mx.array:
    """Gemma 3's `TransformerBlock.__call__` with the attention `attention(self_attn, normed h)` given, and the
    linear layers through `projections` (its MLP's GELU as the model's: `cpu_kernels.gated_gelu`, which with
    `inference` evaluates the block's first half and, on the CPU, runs the GELU in numpy; `folded` as there)."""
    r = attention(layer.self_attn, layer.input_layernorm(h))
    h = clip_residual(h, layer.post_attention_layernorm(r))
    mlp = layer.mlp
    gate, up = projections(layer.pre_feedforward_layernorm(h), [mlp.gate_proj, mlp.up_proj], folded)
    r = projections(gated_gelu(mlp, gate, up, inference), [mlp.down_proj], folded)[0]
    return clip_residual(h, layer.post_feedforward_layernorm(r))


def grouped_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
    """`mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)` for q (B, heads, n, d) against k and
    v (B, kv heads, K, d), with an additive or a boolean `mask` that broadcasts to (B, heads, n, K): the queries of
    the heads that share a key head as the rows of one product, where the CPU fallback makes one product per head
    (a prefill's attention 12% faster; a letter step's 0.6 against 1.2 ms a block for 64 rows)."""
    b, heads, n, d = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    rows = (q * scale).reshape(b, kv_heads, heads // kv_heads * n, d)
    scores = (rows @ k.swapaxes(-1, -2)).reshape(b, heads, n, keys)
    scores = mx.where(mask, scores, -mx.inf) if mask.dtype == mx.bool_ else scores + mask
    p = mx.softmax(scores, axis=-1, precise=True).reshape(b, kv_heads, heads // kv_heads * n, keys)
    return (p @ v).reshape(b, heads, n, d)


def rotations(body, positions: np.ndarray, head_axis: int) -> dict[bool, Rotation]:
    """`Rotation`s at `positions` for the body's global (True) and sliding-window (False) blocks, each read once
    off the first block of its kind."""
    pattern = body.sliding_window_pattern
    kinds = {i % pattern == pattern - 1 for i in range(len(body.layers))}
    return {glob: Rotation(body.layers[pattern - 1 if glob else 0].self_attn.rope, positions, head_axis)
            for glob in kinds}


def _packed_attention(attn, x, rotate: Rotation, prefix, chunks, biases, kv: list | None = None, start: int = 0,
                      folded: bool = False, on_numpy: bool = False):
    """Gemma 3's attention (`gemma3_text.Attention.__call__`) over the packed stream x (1, N, hidden): per-token
    RoPE positions (`rotate`, at the stream's positions), and each chunk's queries against the shared start's keys
    and the chunk's own. The start's keys and values are `prefix` (from an earlier call), or the stream's first
    `start` tokens' (for chunks after them). Appends the stream's keys and values (1, kv heads, N, d) to `kv` when
    given; `folded` as in `projections`; `on_numpy` (inference on the CPU in float32, with numpy `biases`): the
    chunks' attention in numpy (`cpu_kernels.chunk_attention`)."""
    n = x.shape[1]
    q, k, v = projections(x, [attn.q_proj, attn.k_proj, attn.v_proj], folded)
    q = rotate(attn.q_norm(q.reshape(n, attn.n_heads, -1)))                                # (N, heads, d)
    k = rotate(attn.k_norm(k.reshape(n, attn.n_kv_heads, -1)))
    v = v.reshape(n, attn.n_kv_heads, -1)
    if kv is not None:
        kv.append((k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None]))            # (1, kv heads, N, d)
    if on_numpy:
        mx.eval(q, k, v)
        pk, pv = (None, None) if prefix is None else (np.asarray(p)[0].transpose(1, 0, 2) for p in prefix)
        out = mx.array(chunk_attention(np.asarray(q), np.asarray(k), np.asarray(v), attn.scale, chunks, biases,
                                       pk, pv, start))
        return projections(out.reshape(1, n, -1), [attn.o_proj], folded)[0]
    q, k, v = (a.transpose(1, 0, 2)[None] for a in (q, k, v))
    outs = []
    for (lo, hi), bias in zip(chunks, biases):
        kc, vc = k[:, :, lo:hi], v[:, :, lo:hi]
        if prefix is not None:
            kc, vc = mx.concatenate([prefix[0], kc], axis=2), mx.concatenate([prefix[1], vc], axis=2)
        elif start and lo >= start:
            kc, vc = mx.concatenate([k[:, :, :start], kc], axis=2), mx.concatenate([v[:, :, :start], vc], axis=2)
        outs.append(grouped_attention(q[:, :, lo:hi], kc, vc, attn.scale, bias))
    out = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
    return projections(out.transpose(0, 2, 1, 3).reshape(1, n, -1), [attn.o_proj], folded)[0]


def packed_prefill(model, segments: Sequence[Sequence[int]], prefix_kv: list | None, shared: int,
                   start: Sequence[int] | None = None, folded: bool = False):
    """(final-normed hidden state at each segment's last token (P, hidden), per-block (keys, values) of the stream
    (1, kv heads, N, d)) for `segments` (P token lists, none empty) that each continue the `shared` tokens whose
    per-block keys and values (batch 1) are `prefix_kv` (None when shared is 0). With `start` (those `shared`
    tokens, and `prefix_kv` None) the start runs at the head of the stream instead, attending causally to itself,
    and the keys and values returned begin with its own. `folded`: LoRA layers folded (`fold_lora` said yes). See
    the module docstring."""
    body = text_model(model).model
    lengths = np.array([len(s) for s in segments])
    seg = np.repeat(np.arange(len(segments)), lengths)
    pos = (shared + np.arange(len(seg)) - np.repeat(np.cumsum(lengths) - lengths, lengths)).astype(np.int32)
    chunks = attention_chunks(lengths, PREFILL_CHUNK)
    window = body.window_size
    windows = [None] + ([window] if int(lengths.max()) + shared > window else [])   # else the window hides nothing
    biases = {w: [_chunk_bias(seg[lo:hi], pos[lo:hi], shared, w) for lo, hi in chunks] for w in windows}
    parts = [np.asarray(s, dtype=np.int32) for s in segments]
    inline = start is not None and shared > 0
    if inline:                                  # the start's own causal attention, then the chunks after it
        parts.insert(0, np.asarray(start, dtype=np.int32))
        pos = np.concatenate([np.arange(shared, dtype=np.int32), pos])
        chunks = [(0, shared)] + [(lo + shared, hi + shared) for lo, hi in chunks]
        biases = {w: [_chunk_bias(np.zeros(shared, int), pos[:shared], 0, w)] + b for w, b in biases.items()}
    tokens = mx.array(np.concatenate(parts))[None]
    h = embed(body, tokens)
    on_numpy = numpy_inference(h)
    if not on_numpy:
        biases = {w: [mx.array(b).astype(h.dtype) for b in chunk_biases] for w, chunk_biases in biases.items()}
    pattern = body.sliding_window_pattern
    rotate = rotations(body, pos, 1)
    kvs = []
    for i, layer in enumerate(body.layers):
        glob = i % pattern == pattern - 1
        prefix = None if prefix_kv is None else prefix_kv[i]
        bias = biases.get(None if glob else window, biases[None])
        h = block(layer, h, lambda attn, x, prefix=prefix, bias=bias, rotate=rotate[glob]:
                  _packed_attention(attn, x, rotate, prefix, chunks, bias, kvs, shared if inline else 0, folded,
                                    on_numpy),
                  inference=True, folded=folded)
    last = mx.array((np.cumsum(lengths) - 1 + (shared if inline else 0)).astype(np.int32))
    return body.norm(h[0, last]), kvs


@dataclass
class PackedGroups:
    """A GRPO micro-batch of several prompts' replies as one token stream (host side; see the module docstring)."""
    tokens: np.ndarray          # (N,) int32: the shared start, then per prompt its rest and its replies' inputs
    positions: np.ndarray       # (N,) int32: each token's position in its own sequence (RoPE, causality)
    group: np.ndarray           # (N,) int32: the prompt a token belongs to; -1 for the shared start
    segment: np.ndarray         # (N,) int32: 0 for a prompt's own tokens, 1 + the row for a reply's
    start: int                  # the shared start's length: the stream's first tokens
    chunks: list                # (lo, hi) stream ranges after the start: whole prompt groups, attended together
    gather: np.ndarray          # (M,) int32: the stream index of each scored position, in the batch's order


def _group_bias(g: PackedGroups, lo: int, hi: int, window: int | None) -> mx.array:
    """(n, keys) additive bias of the stream's [lo, hi) against the start's keys (when lo is past it) and its own."""
    keys = (np.arange(lo, hi) if lo < g.start or g.start == 0
            else np.concatenate([np.arange(g.start), np.arange(lo, hi)]))
    q = np.arange(lo, hi)
    gq, gk = g.group[q][:, None], g.group[keys][None, :]
    sq, sk = g.segment[q][:, None], g.segment[keys][None, :]
    pq, pk = g.positions[q][:, None], g.positions[keys][None, :]
    ok = ((gk == -1) | ((gk == gq) & ((sk == 0) | (sk == sq)))) & (pk <= pq)
    if window is not None:
        ok &= pq - pk < window
    return mx.array(np.where(ok, 0.0, -np.inf).astype(np.float32))


def packed_groups_hidden(model, g: PackedGroups) -> mx.array:
    """(M, hidden) final-normed hidden states at `g.gather`, the stream run once through the body (with gradient)."""
    body = text_model(model).model
    ranges = ([(0, g.start)] if g.start else []) + list(g.chunks)
    window = body.window_size
    longest = int(g.positions.max()) + 1
    tokens = mx.array(g.tokens)[None]
    h = embed(body, tokens)
    biases = {None: [_group_bias(g, lo, hi, None).astype(h.dtype) for lo, hi in ranges]}
    if longest > window:                          # otherwise the sliding window hides nothing
        biases[window] = [_group_bias(g, lo, hi, window).astype(h.dtype) for lo, hi in ranges]
    pattern = body.sliding_window_pattern
    rotate = rotations(body, g.positions, 1)
    for i, layer in enumerate(body.layers):
        glob = i % pattern == pattern - 1
        bias = biases.get(None if glob else window, biases[None])
        h = block(layer, h, lambda attn, x, bias=bias, rotate=rotate[glob]:
                  _packed_attention(attn, x, rotate, None, ranges, bias, start=g.start))
    return body.norm(h[0, mx.array(g.gather)])

"""A packed prefill: many prompts' remainders after one shared start, run as one token stream with no padding.

Grammar decoding runs the boards of a batch after the system prompt they share. `packed_prefill(model, segments,
prefix_kv, shared)` puts every board's remainder (a segment) end to end into one (1, N) stream, so each block's
linear layers (LoRA included) see all N tokens in one product, and only attention knows the segments: a token's
position is the shared start's length plus its place in its own segment (RoPE, per token), and it attends to the
shared start's keys and to the tokens of its own segment up to itself (causal, and the sliding window). Attention
runs per chunk of whole consecutive segments (at most `ATTENTION_CHUNK` tokens, a segment longer than that alone),
against the start's keys and the chunk's own, under an additive bias made once per call; one bias for the whole
stream would make attention cost N x N, many times the segments' own. The block is Gemma 3's
(`mlx_lm.models.gemma3_text.TransformerBlock`, `block`) with its attention's positions and mask taken over here,
and its linear layers through `projections` (one product for the LoRA down-projections that read the same input,
each LoRA delta added in one fused multiply-add), so the hidden states and keys equal a padded batch's to float32
rounding (tests/test_fast_play.py); the letter steps use the same block. Gemma 3 text models only (`logits.has_split_head`).

The GRPO update packs the same way, with gradient (`PackedGroups`, `packed_groups_hidden`): the stream is the start the
micro-batch's prompts share, then each prompt's rest followed by its replies. A prompt's token attends to the start
and its prompt's earlier tokens; a reply's, to the start, its prompt and its own reply's earlier tokens (never
another reply's). Attention runs over the start, then per chunk of whole prompt groups against the start's keys and
the chunk's own; in training the linear layers are called as they are (their dropout may act).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.gemma3_text import clip_residual

from .cpu_kernels import mlp_gelu
from .logits import text_model

ATTENTION_CHUNK = 128       # stream tokens a chunk of whole segments attends over at once (see the docstring)


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


def _chunk_bias(seg: np.ndarray, pos: np.ndarray, shared: int, window: int | None) -> mx.array:
    """(n, shared + n) additive attention bias of one chunk: 0 where a token may attend, -inf elsewhere."""
    keys = np.concatenate([np.arange(shared), pos])
    same = np.concatenate([np.ones((len(pos), shared), dtype=bool), seg[:, None] == seg[None, :]], axis=1)
    ok = same & (keys[None, :] <= pos[:, None])
    if window is not None:
        ok &= pos[:, None] - keys[None, :] < window
    return mx.array(np.where(ok, 0.0, -np.inf).astype(np.float32))


def projections(x: mx.array, modules: Sequence) -> list[mx.array]:
    """`[m(x) for m in modules]` for linear layers that read the same `x`, with fewer and larger ops: the LoRA
    layers' down-projections (x @ lora_a) as one product, and each layer's delta added to its base output by one
    fused multiply-add (`mx.addmm`, alpha = the LoRA scale); the same sums to float32 rounding. Only for inference
    (a layer in training mode, whose dropout may act, is called as it is) and only where x, the base output and the
    LoRA weights share a dtype (a bfloat16 model keeps float32 LoRA: it is called as it is)."""
    if not all(hasattr(m, "lora_a") and not m.training and m.lora_a.dtype == x.dtype == m.lora_b.dtype
               for m in modules):
        return [m(x) for m in modules]
    a = modules[0].lora_a if len(modules) == 1 else mx.concatenate([m.lora_a for m in modules], axis=1)
    z, out, at = x @ a, [], 0
    for m in modules:
        r = m.lora_a.shape[1]
        out.append(mx.addmm(m.linear(x), z[..., at:at + r] if len(modules) > 1 else z, m.lora_b, alpha=m.scale))
        at += r
    return out


def block(layer, h: mx.array, attention) -> mx.array:
    """Gemma 3's `TransformerBlock.__call__` with the attention `attention(self_attn, normed h)` given, and the
    linear layers through `projections` (its MLP's GELU as the model's: `cpu_kernels.mlp_gelu`)."""
    r = attention(layer.self_attn, layer.input_layernorm(h))
    h = clip_residual(h, layer.post_attention_layernorm(r))
    mlp = layer.mlp
    gate, up = projections(layer.pre_feedforward_layernorm(h), [mlp.gate_proj, mlp.up_proj])
    r = projections(mlp_gelu(mlp)(gate) * up, [mlp.down_proj])[0]
    return clip_residual(h, layer.post_feedforward_layernorm(r))


def _packed_attention(attn, x, positions, prefix, chunks, biases, kv: list | None = None, start: int = 0):
    """Gemma 3's attention (`gemma3_text.Attention.__call__`) over the packed stream x (1, N, hidden): per-token
    RoPE positions, and each chunk's queries against the shared start's keys and the chunk's own. The start's keys
    and values are `prefix` (from an earlier call), or the stream's first `start` tokens' (for chunks after them).
    Appends the stream's keys and values (1, kv heads, N, d) to `kv` when given."""
    n = x.shape[1]
    q, k, v = projections(x, [attn.q_proj, attn.k_proj, attn.v_proj])
    q = attn.q_norm(q.reshape(n, attn.n_heads, 1, -1))                         # (N, heads, 1, d): a row a token
    k = attn.k_norm(k.reshape(n, attn.n_kv_heads, 1, -1))
    q = attn.rope(q, offset=positions)[:, :, 0].transpose(1, 0, 2)[None]       # (1, heads, N, d)
    k = attn.rope(k, offset=positions)[:, :, 0].transpose(1, 0, 2)[None]
    v = v.reshape(n, attn.n_kv_heads, -1).transpose(1, 0, 2)[None]
    if kv is not None:
        kv.append((k, v))
    outs = []
    for (lo, hi), bias in zip(chunks, biases):
        kc, vc = k[:, :, lo:hi], v[:, :, lo:hi]
        if prefix is not None:
            kc, vc = mx.concatenate([prefix[0], kc], axis=2), mx.concatenate([prefix[1], vc], axis=2)
        elif start and lo >= start:
            kc, vc = mx.concatenate([k[:, :, :start], kc], axis=2), mx.concatenate([v[:, :, :start], vc], axis=2)
        outs.append(mx.fast.scaled_dot_product_attention(q[:, :, lo:hi], kc, vc, scale=attn.scale, mask=bias))
    out = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
    return projections(out.transpose(0, 2, 1, 3).reshape(1, n, -1), [attn.o_proj])[0]


def packed_prefill(model, segments: Sequence[Sequence[int]], prefix_kv: list | None, shared: int):
    """(final-normed hidden state at each segment's last token (P, hidden), per-block (keys, values) of the stream
    (1, kv heads, N, d)) for `segments` (P token lists, none empty) that each continue the `shared` tokens whose
    per-block keys and values (batch 1) are `prefix_kv` (None when shared is 0). See the module docstring."""
    body = text_model(model).model
    lengths = np.array([len(s) for s in segments])
    seg = np.repeat(np.arange(len(segments)), lengths)
    pos = (shared + np.arange(len(seg)) - np.repeat(np.cumsum(lengths) - lengths, lengths)).astype(np.int32)
    chunks = attention_chunks(lengths)
    window = body.window_size
    biases = {None: [_chunk_bias(seg[lo:hi], pos[lo:hi], shared, None) for lo, hi in chunks]}
    if int(lengths.max()) + shared > window:      # otherwise the sliding window hides nothing
        biases[window] = [_chunk_bias(seg[lo:hi], pos[lo:hi], shared, window) for lo, hi in chunks]
    tokens = mx.array(np.concatenate([np.asarray(s, dtype=np.int32) for s in segments]))[None]
    h = body.embed_tokens(tokens)
    h = h * mx.array(body.args.hidden_size ** 0.5, mx.bfloat16).astype(h.dtype)
    biases = {w: [b.astype(h.dtype) for b in chunk_biases] for w, chunk_biases in biases.items()}
    positions = mx.array(pos)
    pattern = body.sliding_window_pattern
    kvs = []
    for i, layer in enumerate(body.layers):
        glob = i % pattern == pattern - 1
        prefix = None if prefix_kv is None else prefix_kv[i]
        bias = biases.get(None if glob else window, biases[None])
        h = block(layer, h, lambda attn, x, prefix=prefix, bias=bias:
                  _packed_attention(attn, x, positions, prefix, chunks, bias, kvs))
    last = mx.array((np.cumsum(lengths) - 1).astype(np.int32))
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
    keys = np.arange(lo, hi) if lo < g.start or g.start == 0 else np.concatenate([np.arange(g.start), np.arange(lo, hi)])
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
    h = body.embed_tokens(tokens)
    h = h * mx.array(body.args.hidden_size ** 0.5, mx.bfloat16).astype(h.dtype)
    biases = {None: [_group_bias(g, lo, hi, None).astype(h.dtype) for lo, hi in ranges]}
    if longest > window:                          # otherwise the sliding window hides nothing
        biases[window] = [_group_bias(g, lo, hi, window).astype(h.dtype) for lo, hi in ranges]
    positions = mx.array(g.positions)
    pattern = body.sliding_window_pattern
    for i, layer in enumerate(body.layers):
        glob = i % pattern == pattern - 1
        bias = biases.get(None if glob else window, biases[None])
        h = block(layer, h, lambda attn, x, bias=bias: _packed_attention(attn, x, positions, None, ranges, bias,
                                                                          start=g.start))
    return body.norm(h[0, mx.array(g.gather)])

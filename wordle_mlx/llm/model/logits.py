"""Logits at selected positions only: hidden states -> gather the positions that matter -> output projection.

Gemma 3's vocabulary has 262k entries, so projecting every position of a (batch, length) block onto it
costs more than the rest of the model. Training losses (SFT) and token log-probs (GRPO) only need the
positions that carry loss, so `selected_logits(model, inputs, positions)` runs the model body, gathers
those hidden states, and projects just them. For `gemma3_text` (and the `gemma3` wrapper around it)
the body is `body_hidden` (mlx-lm's `Gemma3Model.__call__`, block by block, already final-normed) and the
head is the tied embedding `embed_tokens.as_linear` or `lm_head`; these models have no final logit
soft-capping. Any other model falls back to full logits followed by the same gather, so results are
identical either way. Running the blocks ourselves lets a shared prompt's keys and values be passed to each
block as plain inputs (`shared_prefix_logits`), which keeps gradient checkpointing (`set_grad_checkpoint`)
exact with prefix sharing. Grammar decoding projects onto its 26 letter tokens only (`head_rows`, their rows of
the projection), and `choice_logprobs` renormalises those logits over the letters a position allows.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_causal_mask
from mlx_lm.tuner.trainer import grad_checkpoint

SPLIT_HEAD_TYPES = ("gemma3_text",)


def text_model(model):
    """The language model inside a multimodal wrapper (`gemma3` -> its `language_model`), else `model`."""
    return getattr(model, "language_model", model)


def embed(body, tokens: mx.array) -> mx.array:
    """Gemma 3's scaled input embeddings of `tokens`: the embedding times sqrt(hidden), that constant rounded to
    bfloat16 as mlx-lm's `Gemma3Model.__call__` rounds it (whatever the model's dtype)."""
    h = body.embed_tokens(tokens)
    return h * mx.array(body.args.hidden_size ** 0.5, mx.bfloat16).astype(h.dtype)


def has_split_head(model) -> bool:
    """True when `model(x) == head(body(x))` with the body and head we know how to call separately."""
    lm = text_model(model)
    return getattr(lm, "model_type", None) in SPLIT_HEAD_TYPES and hasattr(getattr(lm, "model", None), "embed_tokens")


def head_rows(model, token_ids: mx.array) -> mx.array:
    """(K, hidden) rows of the output projection for `token_ids`: the tied embedding's rows (dequantized when it
    is quantized), or the untied head's."""
    lm = text_model(model)
    if getattr(lm, "tie_word_embeddings", False) or not hasattr(lm, "lm_head"):
        return lm.model.embed_tokens(token_ids)
    head = lm.lm_head
    if isinstance(head, nn.QuantizedLinear):
        return mx.dequantize(head.weight[token_ids], head.scales[token_ids], head.biases[token_ids],
                             head.group_size, head.bits)
    return head.weight[token_ids]


def project(model, hidden: mx.array, token_ids: mx.array | None = None) -> mx.array:
    """Output projection of final hidden states onto the vocabulary, or onto `token_ids` only (their rows of the
    projection: grammar decoding's letters)."""
    if token_ids is not None:
        return hidden @ head_rows(model, token_ids).T
    lm = text_model(model)
    if getattr(lm, "tie_word_embeddings", False) or not hasattr(lm, "lm_head"):
        return lm.model.embed_tokens.as_linear(hidden)
    return lm.lm_head(hidden)


def selected_logits(model, inputs: mx.array, positions: mx.array, token_ids: mx.array | None = None) -> mx.array:
    """(P, vocab) logits at `positions`, flat indices into the (B * L) positions of `inputs` (B, L); (P, K) with
    `token_ids` (K,), the logits of those tokens only."""
    if has_split_head(model):
        hidden, _ = body_hidden(model, inputs)
        hidden = hidden.reshape(-1, hidden.shape[-1])[positions]
        return project(model, hidden, token_ids)
    logits = model(inputs)
    logits = logits.reshape(-1, logits.shape[-1])[positions]
    return logits if token_ids is None else logits[:, token_ids]


def hidden_at(model, inputs: mx.array, positions: mx.array, prefix: mx.array | None = None) -> mx.array:
    """(P, hidden) final hidden states at `positions` (flat indices into the (B * L) positions of `inputs`), every
    row of `inputs` continuing the 1-D `prefix` when given; to project once per set of output rows (a loss that
    scores some positions on a few rows and others on the whole vocabulary). Gemma 3 text models only."""
    if not has_split_head(model):
        raise ValueError("hidden_at needs a gemma3_text model")
    prefix_kv = None
    if prefix is not None:
        _, prefix_kv = body_hidden(model, prefix[None], keep_kv=True)
    hidden, _ = body_hidden(model, inputs, prefix_kv)
    return hidden.reshape(-1, hidden.shape[-1])[positions]


def multi_prefix_logits(model, prefixes: mx.array, lengths: mx.array, rows: mx.array, continuations: mx.array,
                        positions: mx.array, token_ids: mx.array | None = None, start: mx.array | None = None
                        ) -> mx.array:
    """`shared_prefix_logits` for several prompts at once: `prefixes` (P, Lp) right-padded, `lengths` (P,) their
    real lengths, and row b of `continuations` continues prompt `rows[b]`. The prompts run through the model once,
    together; each row attends to its own prompt's real positions and its own tokens. With `start` (1-D), every
    prompt is `start` followed by its row of `prefixes`: the start runs once, at batch 1, and the prompts' rests
    continue its keys and values (the gradient reaches it through all of them). Gemma 3 text models only."""
    if not has_split_head(model):
        raise ValueError("multi_prefix_logits needs a gemma3_text model")
    if start is None:
        _, prefix_kv = body_hidden(model, prefixes, keep_kv=True)
    else:
        _, start_kv = body_hidden(model, start[None], keep_kv=True)
        _, rest_kv = body_hidden(model, prefixes, start_kv, keep_kv=True)
        p = prefixes.shape[0]
        prefix_kv = [tuple(mx.concatenate([mx.broadcast_to(s, (p,) + s.shape[1:]), r], axis=2) for s, r in zip(sk, rk))
                     for sk, rk in zip(start_kv, rest_kv)]
        lengths = lengths + start.shape[0]
    hidden, _ = body_hidden(model, continuations, prefix_kv, prefix_rows=rows, prefix_lengths=lengths[rows])
    hidden = hidden.reshape(-1, hidden.shape[-1])[positions]
    return project(model, hidden, token_ids)


def choice_logprobs(logits: mx.array, index: mx.array, allowed: mx.array | None, temperature: float) -> mx.array:
    """log_softmax(logits / T) over the allowed tokens, at `index` (logits (M, K) over the choice tokens,
    index (M,), allowed (M, K) bool or None = all), in float32: grammar decoding's policy, for training."""
    scaled = logits.astype(mx.float32)
    if temperature != 1.0:
        scaled = scaled / temperature
    if allowed is not None:
        scaled = mx.where(allowed, scaled, -mx.inf)
    return mx.take_along_axis(scaled, index[:, None], axis=-1)[:, 0] - mx.logsumexp(scaled, axis=-1)


def full_logits_at(model, inputs: mx.array, positions: mx.array) -> mx.array:
    """Reference path: full (B, L, vocab) logits, then the same gather (for tests and benchmarks)."""
    logits = model(inputs)
    return logits.reshape(-1, logits.shape[-1])[positions]


class _BlockKV:
    """The key/value store one transformer block sees in one call: the prefix's keys and values (given, read
    only, broadcast over the batch) followed by this call's own, which it also keeps (`keys`, `values`). It is
    made afresh inside every call, so a call that gradient checkpointing runs twice sees the same inputs twice
    (a cache that grows on each call would see its own output the second time)."""

    def __init__(self, prefix: tuple[mx.array, mx.array] | None = None, rows: mx.array | None = None,
                 offset: mx.array | None = None):
        self.prefix, self.rows = prefix, rows
        self.offset = offset if rows is not None else 0 if prefix is None else prefix[0].shape[2]
        self.keys = self.values = None

    def update_and_fetch(self, keys, values):
        self.keys, self.values = keys, values
        if self.prefix is None:
            return keys, values
        pk, pv = self.prefix
        if self.rows is not None:         # several prompts: each row's own (its padding is masked out)
            pk, pv = pk[self.rows], pv[self.rows]
        else:
            pk = mx.broadcast_to(pk, (keys.shape[0],) + pk.shape[1:])
            pv = mx.broadcast_to(pv, (values.shape[0],) + pv.shape[1:])
        return mx.concatenate([pk, keys], axis=2), mx.concatenate([pv, values], axis=2)


def _attention_mask(n: int, offset: int, window_size: int | None):
    """The causal mask of `n` new positions after `offset` earlier ones (mlx-lm's "causal" shortcut when it
    means the same), limited to `window_size` positions back for sliding-window layers."""
    if offset == 0 and (window_size is None or n <= window_size):
        return "causal"
    return create_causal_mask(n, offset, window_size=window_size)


def _rows_mask(width: int, lengths: mx.array, n: int, window_size: int | None) -> mx.array:
    """(B, 1, n, width + n) attention mask of `n` new positions per row after a right-padded prompt of `width`
    slots whose first `lengths[b]` are real: prompt keys up to the row's length, then causal over its own tokens,
    limited to `window_size` positions back."""
    key_pos = mx.concatenate([mx.broadcast_to(mx.arange(width)[None], (lengths.shape[0], width)),
                              lengths[:, None] + mx.arange(n)[None]], axis=1)           # (B, width + n)
    valid = mx.concatenate([mx.arange(width)[None] < lengths[:, None],
                            mx.ones((lengths.shape[0], n), dtype=mx.bool_)], axis=1)
    query_pos = lengths[:, None] + mx.arange(n)[None]                                   # (B, n)
    k, q = key_pos[:, None, None, :], query_pos[:, None, :, None]
    mask = valid[:, None, None, :] & (k <= q)
    if window_size is not None:
        mask = mask & (q - k < window_size)
    return mask


def set_grad_checkpoint(model, on: bool = True) -> None:
    """Gradient checkpointing for training forwards: each transformer block keeps only its inputs and is run
    again in the backward pass (less memory, about one more forward's compute). For Gemma 3 text models it is
    a flag on this model that `body_hidden` reads: every block call is a pure function of its parameters, its
    input and the prefix's keys/values (all explicit inputs of `mlx.nn.utils.checkpoint`), so prefix sharing
    keeps its gradients. Any other model gets mlx-lm's `grad_checkpoint` (which patches its block class)."""
    if has_split_head(model):
        text_model(model).model.wordle_grad_checkpoint = bool(on)
    elif on:
        grad_checkpoint(model.layers[0])


def _block_call(layer, h, mask, prefix, keep_kv: bool, rows=None, offset=None):
    kv = _BlockKV(prefix, rows, offset)
    out = layer(h, mask, kv)
    return (out, kv.keys, kv.values) if keep_kv else (out,)


class _KeyedDropout:
    """Stands in for a LoRA layer's `nn.Dropout` during one block call: the same masks every time the call
    runs with the same `key`."""

    def __init__(self, dropout, key: mx.array):
        self.dropout, self.key = dropout, key

    def __call__(self, x: mx.array) -> mx.array:
        keep = self.dropout._p_1
        if keep == 1 or not self.dropout.training:
            return x
        return (mx.random.bernoulli(keep, x.shape, key=mx.stop_gradient(self.key)) * x) * (1 / keep)


def _with_dropout_key(layer, key: mx.array, fn, *args):
    """`fn(*args)` with every dropout inside `layer` drawing its mask from `key` (split per dropout), so the
    recomputation gradient checkpointing makes in the backward pass draws the forward pass's masks (with the
    global random state, it would draw new ones and the gradient would belong to another mask)."""
    owners = [m for _, m in layer.named_modules() if isinstance(m.get("dropout"), nn.Dropout)]
    saved = [m.dropout for m in owners]
    for m, k in zip(owners, mx.random.split(key, max(len(owners), 1))):
        m.dropout = _KeyedDropout(m.dropout, k)
    try:
        return fn(*args)
    finally:
        for m, d in zip(owners, saved):
            m.dropout = d


def body_hidden(model, inputs: mx.array, prefix_kv: list | None = None, keep_kv: bool = False,
                prefix_rows: mx.array | None = None, prefix_lengths: mx.array | None = None):
    """(final-normed hidden states (B, L, hidden), per-block (keys, values) of `inputs` if `keep_kv`) of a
    Gemma 3 text body, the same computation as `Gemma3Model.__call__`; with `prefix_kv` (from an earlier call
    with `keep_kv`, batch 1), every row of `inputs` continues that prefix. With `prefix_rows` (B,), `prefix_kv`
    holds several right-padded prefixes (P rows) and row b continues prefix `prefix_rows[b]`, whose first
    `prefix_lengths[b]` positions are real. Blocks are checkpointed when `set_grad_checkpoint` asked for it."""
    body = text_model(model).model
    checkpoint = getattr(body, "wordle_grad_checkpoint", False)
    h = embed(body, inputs)
    pattern = body.sliding_window_pattern
    if prefix_rows is not None:
        offset = prefix_lengths
        global_mask = _rows_mask(prefix_kv[0][0].shape[2], prefix_lengths, inputs.shape[1], None)
        sliding_mask = _rows_mask(prefix_kv[0][0].shape[2], prefix_lengths, inputs.shape[1], body.window_size)
    else:
        offset = 0 if prefix_kv is None else prefix_kv[0][0].shape[2]
        global_mask = _attention_mask(inputs.shape[1], offset, None)
        sliding_mask = _attention_mask(inputs.shape[1], offset, body.window_size) if pattern > 1 else None
    kvs = []
    for i, layer in enumerate(body.layers):
        mask = global_mask if i % pattern == pattern - 1 else sliding_mask
        prefix = None if prefix_kv is None else prefix_kv[i]
        key = mx.random.randint(0, 2 ** 31 - 1, (2,)).astype(mx.uint32)   # this block's dropout masks
        if checkpoint:
            block = nn.utils.checkpoint(layer, lambda x, key, *pkv, layer=layer, mask=mask: _with_dropout_key(
                layer, key, _block_call, layer, x, mask, pkv or None, keep_kv, prefix_rows, offset))
            out = block(h, key, *(prefix or ()))
        else:
            out = _with_dropout_key(layer, key, _block_call, layer, h, mask, prefix, keep_kv, prefix_rows, offset)
        h = out[0]
        if keep_kv:
            kvs.append(tuple(out[1:]))
    return body.norm(h), kvs


def shared_prefix_logits(model, prefix: mx.array, continuations: mx.array, positions: mx.array,
                         token_ids: mx.array | None = None) -> mx.array:
    """(P, vocab) logits at `positions` (flat indices into the (G * L) continuation block) for G sequences
    that all start with the same `prefix` (1-D): the prefix runs through the model once, and its keys and
    values serve every continuation. Equal to `selected_logits` on the G concatenated sequences (the
    prefix's own positions are not scored), at a fraction of the cost when the prefix is the long part
    (GRPO turn mode: G replies to one prompt). Gemma 3 text models only (`has_split_head`)."""
    if not has_split_head(model):
        raise ValueError("shared_prefix_logits needs a gemma3_text model")
    _, prefix_kv = body_hidden(model, prefix[None], keep_kv=True)
    hidden, _ = body_hidden(model, continuations, prefix_kv)
    hidden = hidden.reshape(-1, hidden.shape[-1])[positions]
    return project(model, hidden, token_ids)


def selected_logprobs(model, inputs, positions, targets, temperature: float, prefix=None, choices=None):
    """log_softmax(logits / T)[target] at the flat `positions` only (the vocabulary projection is the costly part).
    With `prefix`, every row of `inputs` continues that one prefix, or with a (prompts, lengths, rows[, start])
    tuple the prompt `rows[b]` (see `pack_shared_batch`). With `choices`
    (grammar decoding: `choice_arrays`), the targets are letter choices and the log-softmax runs over the allowed
    letters only, from their rows of the projection."""
    ids = None if choices is None else choices["ids"]
    if isinstance(prefix, tuple):
        scaled = multi_prefix_logits(model, *prefix[:3], inputs, positions, ids, *prefix[3:]).astype(mx.float32)
    elif prefix is not None:
        scaled = shared_prefix_logits(model, prefix, inputs, positions, ids).astype(mx.float32)
    else:
        scaled = selected_logits(model, inputs, positions, ids).astype(mx.float32)
    return target_logprobs(scaled, targets, temperature, choices)


def target_logprobs(scaled: mx.array, targets: mx.array, temperature: float, choices=None) -> mx.array:
    """log_softmax(logits / T)[target] of float32 logits at the scored positions: over the vocabulary, or with
    `choices` over the allowed letters (`choice_logprobs`)."""
    if choices is not None:
        return choice_logprobs(scaled, choices["index"], choices["allowed"], temperature)
    if temperature != 1.0:
        scaled = scaled / temperature
    # no full (positions, vocab) log-softmax: the target logit minus the log-partition is enough
    return mx.take_along_axis(scaled, targets[:, None], axis=-1)[:, 0] - mx.logsumexp(scaled, axis=-1)


def grad_checkpointed(model) -> bool:
    """True when `set_grad_checkpoint` switched checkpointing on for this Gemma 3 text model."""
    return has_split_head(model) and getattr(text_model(model).model, "wordle_grad_checkpoint", False)

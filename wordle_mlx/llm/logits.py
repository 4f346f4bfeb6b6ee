"""Logits at selected positions only: hidden states -> gather the positions that matter -> output projection.

Gemma 3's vocabulary has 262k entries, so projecting every position of a (batch, length) block onto it
costs more than the rest of the model. Training losses (SFT) and token log-probs (GRPO) only need the
positions that carry loss, so `selected_logits(model, inputs, positions)` runs the model body, gathers
those hidden states, and projects just them. For `gemma3_text` (and the `gemma3` wrapper around it)
the body is `model.model(inputs)` (already final-normed) and the head is the tied embedding
`embed_tokens.as_linear` or `lm_head`; these models have no final logit soft-capping. Any other model
falls back to full logits followed by the same gather, so results are identical either way.
"""

from __future__ import annotations

import mlx.core as mx

SPLIT_HEAD_TYPES = ("gemma3_text",)


def text_model(model):
    """The language model inside a multimodal wrapper (`gemma3` -> its `language_model`), else `model`."""
    return getattr(model, "language_model", model)


def has_split_head(model) -> bool:
    """True when `model(x) == head(body(x))` with the body and head we know how to call separately."""
    lm = text_model(model)
    return getattr(lm, "model_type", None) in SPLIT_HEAD_TYPES and hasattr(getattr(lm, "model", None), "embed_tokens")


def project(model, hidden: mx.array) -> mx.array:
    """Output projection of final hidden states onto the vocabulary."""
    lm = text_model(model)
    if getattr(lm, "tie_word_embeddings", False) or not hasattr(lm, "lm_head"):
        return lm.model.embed_tokens.as_linear(hidden)
    return lm.lm_head(hidden)


def selected_logits(model, inputs: mx.array, positions: mx.array) -> mx.array:
    """(P, vocab) logits at `positions`, flat indices into the (B * L) positions of `inputs` (B, L)."""
    if has_split_head(model):
        hidden = text_model(model).model(inputs)
        hidden = hidden.reshape(-1, hidden.shape[-1])[positions]
        return project(model, hidden)
    logits = model(inputs)
    return logits.reshape(-1, logits.shape[-1])[positions]


def full_logits_at(model, inputs: mx.array, positions: mx.array) -> mx.array:
    """Reference path: full (B, L, vocab) logits, then the same gather (for tests and benchmarks)."""
    logits = model(inputs)
    return logits.reshape(-1, logits.shape[-1])[positions]


class _PrefixCache:
    """A training-time KV cache for one layer: the prefix's keys and values (with their autodiff graph),
    then a batch of continuations that all attend to that one prefix (broadcast over the batch)."""

    def __init__(self):
        self.keys = self.values = None
        self.offset = 0

    def update_and_fetch(self, keys, values):
        import mlx.core as mx

        if self.keys is not None:
            shape = (keys.shape[0],) + self.keys.shape[1:]
            keys = mx.concatenate([mx.broadcast_to(self.keys, shape), keys], axis=2)
            values = mx.concatenate([mx.broadcast_to(self.values, (values.shape[0],) + self.values.shape[1:]),
                                     values], axis=2)
        self.keys, self.values = keys, values
        self.offset = keys.shape[2]
        return keys, values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        from mlx_lm.models.base import create_causal_mask

        if self.offset == 0 and not return_array and (window_size is None or n <= window_size):
            return "causal"
        return create_causal_mask(n, self.offset, window_size=window_size)


def shared_prefix_logits(model, prefix: mx.array, continuations: mx.array, positions: mx.array) -> mx.array:
    """(P, vocab) logits at `positions` (flat indices into the (G * L) continuation block) for G sequences
    that all start with the same `prefix` (1-D): the prefix runs through the model once, and its keys and
    values serve every continuation. Equal to `selected_logits` on the G concatenated sequences (the
    prefix's own positions are not scored), at a fraction of the cost when the prefix is the long part
    (GRPO turn mode: G replies to one prompt). Gemma 3 text models only (`has_split_head`)."""
    if not has_split_head(model):
        raise ValueError("shared_prefix_logits needs a gemma3_text model")
    body = text_model(model).model
    caches = [_PrefixCache() for _ in body.layers]
    body(prefix[None], cache=caches)
    hidden = body(continuations, cache=caches)
    hidden = hidden.reshape(-1, hidden.shape[-1])[positions]
    return project(model, hidden)

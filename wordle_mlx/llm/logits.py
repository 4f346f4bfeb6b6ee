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

"""Token-id helpers shared by the decoders: which tokens end a reply, and how long a run of prompts agrees.

`end_token_ids` and `reply_end_id` read a tokenizer's vocabulary (its EOS ids and Gemma's `<end_of_turn>`);
`common_prefix_length` measures the token prefix every prompt in a batch shares, which the samplers run through
the model once. They sit here, below `generation.py`, `reply_grammar.py` and `letter_decoder.py`, so those
modules import them without importing each other. Plain Python: no mlx, no model.
"""

from __future__ import annotations

from typing import Sequence


def end_token_ids(tokenizer) -> set[int]:
    """EOS ids of the tokenizer plus `<end_of_turn>` when the vocabulary has it."""
    ids = set(int(t) for t in getattr(tokenizer, "eos_token_ids", None) or [])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    if "<end_of_turn>" in vocab:
        ids.add(int(vocab["<end_of_turn>"]))
    return ids


def reply_end_id(tokenizer, end_ids: set[int]) -> int:
    """The token that ends a reply: `<end_of_turn>` when the vocabulary has it, else the smallest EOS id."""
    turn = tokenizer.get_vocab().get("<end_of_turn>")
    return int(turn) if turn is not None else min(end_ids)


def common_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
    """The number of leading tokens all of `seqs` (at least one) have in common."""
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in seqs):
            return i
    return n

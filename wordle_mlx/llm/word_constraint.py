"""Optional constrained decoding: a reply in the letters format that can only spell an allowed word.

With `guess_format="letters"` a reply is `<guess> c r a n e</guess>` followed by the end token, which
Gemma's tokenizer writes as 3 tag tokens, 5 single-letter tokens (" c", " r", ...), 3 tag tokens and
`<end_of_turn>`. `AllowedWordsConstraint` is an mlx-lm logits processor that allows, at each step of a
reply, only the tokens of that shape, and at the letter steps only the letters that continue some word
of the allowed list (a prefix trie of the 12,972 guesses, never the answer list): the model still picks
every letter, but it cannot write a word the game would reject. It is an inference option (`wordle-mlx
eval --constrain`, `play --constrain`), reported apart from unconstrained play and never used to sample
GRPO rollouts (their log-probs must be the unconstrained policy's). One processor serves one sequence; it
is told how many context tokens precede the reply, since mlx-lm hands it the prompt tokens it was given
plus the tokens generated so far.
"""

from __future__ import annotations

from typing import Collection

import numpy as np

from ..errors import UserError

LETTERS = "abcdefghijklmnopqrstuvwxyz"
SAMPLE_REPLY = "<guess> c r a n e</guess>"


class LettersTemplate:
    """Token ids of the letters-format reply for one tokenizer: tag tokens, letter tokens, end token."""

    def __init__(self, tokenizer, end_id: int):
        ids = tokenizer.encode(SAMPLE_REPLY, add_special_tokens=False)
        letter_ids = {}
        for c in LETTERS:
            piece = tokenizer.encode(f"<guess> {c}", add_special_tokens=False)
            letter_ids[c] = piece[-1]
            if len(piece) != 4 or tokenizer.decode([piece[-1]]) != f" {c}":
                raise UserError(f"--constrain: this tokenizer does not write ' {c}' as one token after '<guess>'; "
                                "the word constraint needs the Gemma tokenizer's letter tokens")
        if len(ids) != 11 or [tokenizer.decode([t]) for t in ids[3:8]] != [" c", " r", " a", " n", " e"]:
            raise UserError(f"--constrain: this tokenizer splits {SAMPLE_REPLY!r} into {len(ids)} tokens, not the "
                            "3 + 5 + 3 the word constraint expects")
        self.open, self.close, self.end = ids[:3], ids[8:], end_id
        self.letter = letter_ids
        self.letter_of = {t: c for c, t in letter_ids.items()}


def prefix_trie(words: Collection[str]) -> dict[str, frozenset[str]]:
    """{prefix: the letters that can follow it in some word} for every proper prefix of 5-letter `words`."""
    nexts: dict[str, set[str]] = {}
    for w in words:
        for i in range(5):
            nexts.setdefault(w[:i], set()).add(w[i])
    return {k: frozenset(v) for k, v in nexts.items()}


class AllowedWordsConstraint:
    """Logits processor for one sequence whose reply starts after `context_length` context tokens."""

    def __init__(self, template: LettersTemplate, trie: dict[str, frozenset[str]], context_length: int):
        self.t, self.trie, self.start = template, trie, context_length

    def allowed(self, reply: list[int]) -> list[int]:
        """Token ids allowed after the reply tokens generated so far."""
        n = len(reply)
        if n < 3:
            return [self.t.open[n]]
        if n < 8:
            prefix = "".join(self.t.letter_of[tok] for tok in reply[3:n])
            return [self.t.letter[c] for c in sorted(self.trie.get(prefix, ()))]
        if n < 11:
            return [self.t.close[n - 8]]
        return [self.t.end]

    def __call__(self, context, logits):
        import mlx.core as mx

        tokens = context.tolist() if hasattr(context, "tolist") else list(context)
        allowed = self.allowed([int(x) for x in tokens[self.start:]])
        mask = np.full((logits.shape[-1],), -np.inf, dtype=np.float32)
        mask[allowed] = 0.0
        return logits + mx.array(mask)

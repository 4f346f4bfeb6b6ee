"""Which of several replies to one prompt does the model prefer? Sequence log-probabilities, teacher-forced.

`reply_token_ids(tokenizer, messages, reply)` gives the tokens the chat template appends for an assistant
reply (exactly what SFT trains on: the full conversation's ids minus the prompt's, generation prompt
included). `reply_logprobs(model, prompt_ids, replies)` returns, for each reply, the sum over its tokens of
log p(token | prompt, earlier reply tokens) under `model`, computed with the prompt run once and every
reply attending to its keys and values (`logits.shared_prefix_logits`, Gemma 3 text models), in chunks so
that the (tokens x 262k) logits stay small. Tokens that every reply starts with (the `<guess>` tag) have the
same context in every row, so they are scored once and added to each sum. Replies may differ in length;
padding is never scored. No gradient graph is built. `letter_logprobs(model, prompt_ids, words, grammar)` is
the same score under grammar decoding's policy: only the 5 letters of a letters-format reply, each a choice among
the 26 letter tokens (their rows of the output projection, never the full vocabulary); the forced tags add 0.
Given a `trie` (a `WordTrie`) and the board's words, it is words decoding's policy instead: each letter a choice
among the letters that continue an allowed word off the board.
`wordle-mlx data self-play` uses them to label a board with the fitting word the model already likes best.
"""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np

from ..model.logits import shared_prefix_logits
from .reply_grammar import LETTERS


def reply_token_ids(tokenizer, messages: list[dict], reply: str, prompt_ids: Sequence[int] | None = None) -> list[int]:
    """Token ids the chat template adds after the generation prompt for the assistant `reply`."""
    if prompt_ids is None:
        prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(list(messages) + [{"role": "assistant", "content": reply}])
    prompt_ids, full = [int(t) for t in prompt_ids], [int(t) for t in full]
    if full[:len(prompt_ids)] != prompt_ids or len(full) == len(prompt_ids):
        raise ValueError("the chat template's assistant turn does not extend the generation prompt")
    return full[len(prompt_ids):]


def reply_logprobs(model, prompt_ids: Sequence[int], replies: Sequence[Sequence[int]], chunk: int = 32) -> np.ndarray:
    """(len(replies),) float64: log p(reply | prompt) for each reply, summed over the reply's tokens."""
    if len(prompt_ids) < 2:
        raise ValueError("the prompt needs at least 2 tokens")
    if any(len(r) == 0 for r in replies):
        raise ValueError("every reply needs at least one token")
    prefix = mx.array([int(t) for t in prompt_ids[:-1]])
    last = int(prompt_ids[-1])
    replies = [list(map(int, r)) for r in replies]
    # tokens every reply starts with see the same context in every row: score them once (row 0), not per row
    shared, limit = 0, min(len(r) for r in replies) - 1
    while shared < limit and all(r[shared] == replies[0][shared] for r in replies):
        shared += 1
    out = np.zeros(len(replies), dtype=np.float64)
    common = 0.0
    for start in range(0, len(replies), chunk):
        part = replies[start:start + chunk]
        width = max(len(r) for r in part)
        # row j feeds the prompt's last token then the reply's own tokens; position t predicts reply token t
        inputs = [[last] + r[:-1] + [0] * (width - len(r)) for r in part]
        scored = [range(0 if start + j == 0 else shared, len(r)) for j, r in enumerate(part)]
        token_lp = _scored_token_logprobs(model, prefix, inputs, part, scored, width)
        if start == 0:
            common = float(token_lp[:shared].sum())
        row = np.repeat(np.arange(len(part)), [len(ts) for ts in scored])
        out[start:start + len(part)] = np.bincount(row, weights=token_lp, minlength=len(part)) + common
    out[0] -= common                      # row 0 scored its shared tokens itself
    return out


def letter_logprobs(model, prompt_ids: Sequence[int], words: Sequence[str], grammar, chunk: int = 32, trie=None,
                    board: Sequence[str] = ()) -> np.ndarray:
    """(len(words),) float64: the log-probability of each word as a letters reply under grammar decoding (the
    full model's distribution at each letter renormalised over the 26 letters of `grammar`, a `LetterGrammar`;
    forced tokens score 0), teacher-forced; with `trie`, under words decoding (renormalised over the letters
    `trie.allowed` gives after the word's earlier letters, off `board`). The prompt and the opening tag run once
    for every word."""
    if any(len(w) != 5 or not set(w) <= set(LETTERS) for w in words):
        raise ValueError("every word needs 5 lowercase letters")
    head = [int(t) for t in prompt_ids] + list(grammar.open)
    prefix, last = mx.array(head[:-1]), head[-1]
    step = len(grammar.sep) + 1                      # tokens a letter takes: the forced separator, then the letter
    letter_ids = mx.array(grammar.letter_ids)
    out = np.zeros(len(words), dtype=np.float64)
    for start in range(0, len(words), chunk):
        part = words[start:start + chunk]
        index = np.array([[LETTERS.index(c) for c in w] for w in part], dtype=np.int32)
        tokens = [[t for i in row for t in grammar.sep + [grammar.letter_ids[i]]] for row in index]
        inputs = mx.array([[last] + r[:-1] for r in tokens])
        width = 5 * step
        positions = mx.array([j * width + k * step + step - 1 for j in range(len(part)) for k in range(5)])
        logits = shared_prefix_logits(model, prefix, inputs, positions, letter_ids).astype(mx.float32)
        if trie is not None:
            allowed = np.array([trie.allowed(w[:k], board) for w in part for k in range(5)])
            if not allowed[np.arange(len(allowed)), index.reshape(-1)].all():
                raise ValueError("a scored word is not allowed in words decoding (not an allowed word, or on the board)")
            logits = mx.where(mx.array(allowed), logits, -mx.inf)
        picked = mx.take_along_axis(logits, mx.array(index.reshape(-1))[:, None], axis=-1)[:, 0]
        lp = np.array(picked - mx.logsumexp(logits, axis=-1), dtype=np.float64)
        out[start:start + len(part)] = lp.reshape(len(part), 5).sum(axis=1)
    return out


def _scored_token_logprobs(model, prefix, inputs, part, scored, width, temperature: float = 1.0) -> np.ndarray:
    """Flat float64 log p(token) at `temperature` of the scored reply tokens, row by row, in order."""
    positions = [j * width + t for j, ts in enumerate(scored) for t in ts]
    targets = [part[j][t] for j, ts in enumerate(scored) for t in ts]
    logits = shared_prefix_logits(model, prefix, mx.array(inputs), mx.array(positions)).astype(mx.float32)
    if temperature != 1.0:
        logits = logits / temperature
    picked = mx.take_along_axis(logits, mx.array(targets)[:, None], axis=-1)[:, 0]
    return np.array(picked - mx.logsumexp(logits, axis=-1), dtype=np.float64)


def reply_token_logprobs(model, prompt_ids: Sequence[int], replies: Sequence[Sequence[int]], temperature: float = 1.0,
                         chunk: int = 32) -> list[np.ndarray]:
    """For each reply, float64 log p(token | prompt, earlier reply tokens) of each of its tokens at `temperature`
    (the policy log-probs a sampled reply would carry; every row scores all of its own tokens)."""
    if len(prompt_ids) < 2 or any(len(r) == 0 for r in replies):
        raise ValueError("the prompt needs at least 2 tokens and every reply at least one")
    prefix, last = mx.array([int(t) for t in prompt_ids[:-1]]), int(prompt_ids[-1])
    out = []
    for start in range(0, len(replies), chunk):
        part = [list(map(int, r)) for r in replies[start:start + chunk]]
        width = max(len(r) for r in part)
        inputs = [[last] + r[:-1] + [0] * (width - len(r)) for r in part]
        flat = _scored_token_logprobs(model, prefix, inputs, part, [range(len(r)) for r in part], width, temperature)
        out += np.split(flat, np.cumsum([len(r) for r in part])[:-1])
    return out

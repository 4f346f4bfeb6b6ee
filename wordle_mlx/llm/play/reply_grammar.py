"""Grammar-constrained replies: the letters-format reply as forced tokens and letter choices, scored on 26 rows.

A letters reply without a think block, `<guess> c r a n e</guess>` and the end token, has a fixed shape: Gemma's
tokenizer writes it as 3 tag tokens, 5 single-letter tokens (" c", " r", ...), 3 tag tokens and `<end_of_turn>`
(a character-level tokenizer writes a forced space before each letter token instead). `LetterGrammar` holds
that shape for one tokenizer. In `grammar` decoding only the 5 letter positions are decoded; the tags, spaces and
end token are forced (log-prob 0, not trained on), and each letter's logits are computed for the 26 letter tokens
only, from their rows of the output projection (the tied embedding), never for the 262k-entry vocabulary. The
policy is then exactly the full model's distribution renormalised over the allowed tokens at each position. In
`words` decoding the allowed letters at each position are those that continue some allowed guess (a prefix trie
of the 12,972 words, `WordTrie`) and spell no word already on the board, so a reply always spells a word the game
accepts and never repeats a guess; `free` is the model's own unconstrained reply. `letter_decoder.py` decodes with it;
`logits.choice_logprobs` is the same renormalised log-softmax for training (GRPO's update and, as an option, the SFT
loss), so sampler and trainer agree to float rounding. This module does not import mlx (the configs import it).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Collection, Literal, Sequence

import numpy as np

from ...errors import UserError
from .tokens import end_token_ids, reply_end_id

DecodeMode = Literal["free", "grammar", "words"]
DECODE_MODES = ("free", "grammar", "words")
DECODE_HELP = ("free: the model writes the whole reply over its full vocabulary; grammar: the reply's tags are "
               "forced and only its 5 letters are decoded, over the 26 letter tokens; words: as grammar, with the "
               "letters limited to spell an allowed guess. grammar and words need the letters format without a "
               "think block; other formats are decoded free.")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
SAMPLE_REPLY = "<guess> c r a n e</guess>"
ADAPTER_DECODE_KEY = "decode"        # adapter_config.json: the decoding mode the adapter was trained for
ADAPTER_FREE_KEY = "trained_free"    # adapter_config.json: whether every reply token was trained over the vocabulary
LEGACY_TAGS_KEY = "trained_tags"     # what adapters recorded before: whether the tags alone were (free needs more)


def adapter_decoding(adapter_dir: str | Path | None) -> tuple[str | None, bool | None]:
    """(the decoding mode an adapter records it was trained for, whether its whole reply was trained over the
    vocabulary, which free decoding needs); None for what it does not record (adapters trained before the record
    existed). An older adapter's `trained_tags` counts as trained for free only with `decode` free: the tags alone
    were trained otherwise, and such an adapter loses every free game (docs/RESULTS.md)."""
    if adapter_dir is None:
        return None, None
    path = Path(adapter_dir) / "adapter_config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, None        # a missing or broken adapter is reported by the model loader, with its own message
    if not isinstance(raw, dict):
        return None, None
    mode, tags = raw.get(ADAPTER_DECODE_KEY), raw.get(ADAPTER_FREE_KEY)
    if tags is None and isinstance(raw.get(LEGACY_TAGS_KEY), bool):
        tags = mode == "free" and raw[LEGACY_TAGS_KEY]
    if mode is not None and mode not in DECODE_MODES:
        raise UserError(f"{path}: {ADAPTER_DECODE_KEY}: unknown mode {mode!r}; use {', '.join(DECODE_MODES)}")
    if tags is not None and not isinstance(tags, bool):
        raise UserError(f"{path}: {ADAPTER_FREE_KEY}: expected true or false, got {tags!r}")
    return mode, tags


def untrained_free_warning(adapter_dir: str | Path | None, mode: str) -> str | None:
    """One line when an adapter plays free decoding but records that its reply was never trained over the whole
    vocabulary (only its letters among the letter tokens, perhaps its tags)."""
    recorded, tags = adapter_decoding(adapter_dir)
    if mode != "free" or tags is not False:
        return None
    return (f"warning: adapter {adapter_dir} was trained for {recorded} decoding, never on the whole reply; in free "
            f"decoding it may lose its games on format errors (--decode {recorded} plays the policy it learned)")


def decoding_record(mode: str, trained_free: bool) -> dict:
    """The adapter_config.json entries that record what an adapter was trained for."""
    return {ADAPTER_DECODE_KEY: mode, ADAPTER_FREE_KEY: bool(trained_free)}


def grammar_applies(prompt) -> bool:
    """True when replies in this prompt format have a fixed shape (letters format, no think block)."""
    return prompt.guess_format == "letters" and not prompt.require_think


def effective_mode(mode: str, prompt, explicit: bool, field: str = "decode") -> str:
    """The decoding mode actually used: `mode`, or free when the format has free text (an error when the user
    asked for grammar or words explicitly with such a format)."""
    if mode not in DECODE_MODES:
        raise UserError(f"{field}: unknown mode {mode!r}; use {', '.join(DECODE_MODES)}")
    if mode == "free" or grammar_applies(prompt):
        return mode
    if explicit:
        raise UserError(f"{field}: {mode!r} decoding needs guess_format 'letters' without a think block, not "
                        f"guess_format {prompt.guess_format!r} with require_think {prompt.require_think}")
    return "free"


class LetterGrammar:
    """Token ids of the letters-format reply for one tokenizer: `open` tag tokens, the forced `sep` before each
    letter (empty for Gemma), the 26 `letter_ids`, the `close` tag tokens and the `end` token."""

    def __init__(self, tokenizer, end_id: int):
        enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
        self.open = enc("<guess>")
        seps, letters = set(), []
        for c in LETTERS:
            piece = enc(f"<guess> {c}")
            rest = piece[len(self.open):]
            if piece[:len(self.open)] != self.open or not 1 <= len(rest) <= 2 or \
                    tokenizer.decode(rest[-1:]).strip() != c:
                raise UserError(f"decode: this tokenizer does not write ' {c}' after '<guess>' as a letter token "
                                "(with at most one space token before it); grammar decoding needs one token a letter")
            seps.add(tuple(rest[:-1]))
            letters.append(rest[-1])
        if len(seps) != 1 or len(set(letters)) != 26:
            raise UserError("decode: this tokenizer writes the letters of a reply in different shapes")
        self.sep = list(seps.pop())
        self.letter_ids = letters
        self.index_of = {t: i for i, t in enumerate(letters)}
        full = enc(SAMPLE_REPLY)
        body = self.open + [x for c in "crane" for x in self.sep + [letters[LETTERS.index(c)]]]
        if full[:len(body)] != body or tokenizer.decode(full[len(body):]) != "</guess>":
            raise UserError(f"decode: this tokenizer splits {SAMPLE_REPLY!r} differently from its parts")
        self.close = full[len(body):]
        self.end = int(end_id)

    def reply(self, word_letters: list[int]) -> tuple[list[int], list[int]]:
        """(token ids of the whole reply spelling these letter indices, end token included; 1 where a token is a
        letter choice, 0 where it is forced)."""
        tokens, choice = list(self.open), [0] * len(self.open)
        for i in word_letters:
            tokens += self.sep + [self.letter_ids[i]]
            choice += [0] * len(self.sep) + [1]
        tokens += self.close + [self.end]
        return tokens, choice + [0] * (len(self.close) + 1)

    @classmethod
    def for_tokenizer(cls, tokenizer) -> "LetterGrammar":
        """The grammar of `tokenizer`'s replies, ended by its reply end token (`<end_of_turn>` for Gemma)."""
        return cls(tokenizer, reply_end_id(tokenizer, end_token_ids(tokenizer)))


class WordTrie:
    """Words decoding's letter masks: the 5-letter `words` as counts of the words under each prefix, so that
    `allowed(prefix, excluded)` gives the letters that continue `prefix` into some word that is not in
    `excluded` (the words already on the board). The sampler and the trainer both take their masks from here."""

    def __init__(self, words: Collection[str]):
        self.words = frozenset(words)
        self.counts = Counter(w[:i] for w in self.words for i in range(1, 6))
        self._table: tuple[np.ndarray, np.ndarray, dict[str, int]] | None = None

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """The trie as arrays, for masks computed on the device: `child` (nodes, 26), the node a letter leads to
        from each node (-1: no word continues that way; node 0 is the empty prefix), and `count` (nodes,), the
        words under each node."""
        if self._table is None:
            prefixes = [""] + sorted(self.counts)
            node = {p: i for i, p in enumerate(prefixes)}
            child = np.full((len(prefixes), 26), -1, dtype=np.int32)
            for p in prefixes[1:]:
                child[node[p[:-1]], LETTERS.index(p[-1])] = node[p]
            count = np.array([len(self.words)] + [self.counts[p] for p in prefixes[1:]], dtype=np.int32)
            self._table = (child, count, node)
        return self._table[0], self._table[1]

    def path(self, word: str) -> list[int]:
        """The 6 nodes `word` passes through (the empty prefix first), or -1s for a word outside the list."""
        self.table()
        if word not in self.words:
            return [-1] * 6
        return [self._table[2][word[:i]] for i in range(6)]

    def allowed(self, prefix: str, excluded: Collection[str] = ()) -> np.ndarray:
        """(26,) bool: letter c is allowed after `prefix` when some word starting `prefix + c` is not excluded."""
        n = len(prefix) + 1
        gone = Counter(w[:n] for w in set(excluded) if w in self.words and w.startswith(prefix))
        return np.array([self.counts.get(prefix + c, 0) > gone.get(prefix + c, 0) for c in LETTERS])


class LetterChoices:
    """What the trainer needs to score letter choices: the grammar's letter token ids and, in words mode, the
    `WordTrie` that limits them. `masks(targets, sequence, excluded)` gives each letter target's index among the
    26 and the letters allowed at its position (all of them in grammar mode; in words mode those that continue
    the letters its sequence has written before it into a word not in `excluded[sequence]`, its board's words)."""

    def __init__(self, grammar: LetterGrammar, trie: WordTrie | None = None):
        self.grammar, self.trie = grammar, trie

    def masks(self, targets: np.ndarray, sequence: np.ndarray,
              excluded: Sequence[Collection[str]] | None = None) -> tuple[np.ndarray, np.ndarray]:
        index = np.array([self.grammar.index_of.get(int(t), -1) for t in targets], dtype=np.int32)
        if (index < 0).any():
            bad = int(targets[int(np.flatnonzero(index < 0)[0])])
            raise ValueError(f"token {bad} is trained on as a letter choice but is not one of the 26 letter tokens")
        allowed = np.ones((len(targets), 26), dtype=bool)
        if self.trie is not None:
            written: dict[int, str] = {}
            for m, (i, s) in enumerate(zip(index, sequence)):
                prefix = written.get(int(s), "")
                allowed[m] = self.trie.allowed(prefix, excluded[int(s)] if excluded is not None else ())
                if not allowed[m, i]:
                    raise ValueError(f"letter {LETTERS[i]!r} after {prefix!r} is trained on but words decoding "
                                     "never offers it (no allowed word off the board continues that way)")
                written[int(s)] = prefix + LETTERS[i]
        return index, allowed

"""GBNF grammars of the letters reply, for llama.cpp (`--grammar-file`, llama-cpp-python's `LlamaGrammar`).

llama.cpp constrains decoding with a GBNF grammar over the reply's text. `reply_pieces` reads the reply's text
pieces off the model's own tokens (`LetterGrammar`): the opening tag, what each letter token writes before its
letter (a space for Gemma, whose letter tokens are " c", " r", ...), and the closing tag, so the grammar spells
the reply exactly as the model's tokens do (`<guess> c r a n e</guess>`). `grammar_gbnf` is `grammar` decoding:
the tags and 5 letters a-z. `words_gbnf` is `words` decoding: the 5 letters spell an allowed guess, written as
a trie of the words whose identical subtrees are shared (a minimal automaton: one rule per distinct set of
endings, letters with the same endings merged into one character class), so the file stays small and parses
quickly. A grammar file is fixed, so unlike wordle-mlx's words decoding it cannot rule out the words already
on the board; `reply_gbnf(..., board=...)` writes the grammar of one board (`wordle-mlx grammar`), the allowed
words minus the board's, for a client that sends a fresh grammar each turn. A grammar constrains text, not
tokens: `banned_token_ids` lists the tokens outside the decoder's own (`reply_token_ids`), which a logit bias
(`logit_bias_json`) keeps llama.cpp from taking. `GbnfMatcher` is a small pure-Python reader of the GBNF subset written here
(rules, literals, character classes, rule references, alternatives, groups, comments) that says whether a
grammar accepts a whole text; it checks the files without llama.cpp.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Collection

import numpy as np

from ...errors import UserError
from .reply_grammar import LETTERS, LetterGrammar

GRAMMAR_MODES = ("grammar", "words")


@dataclass(frozen=True)
class ReplyPieces:
    """The reply's text around its letters: `open` tag, `before` each letter, `close` tag."""
    open: str
    before: str
    close: str

    def reply(self, word: str) -> str:
        return self.open + "".join(self.before + c for c in word) + self.close


def reply_pieces(tokenizer) -> ReplyPieces:
    """The letters reply's text pieces as `tokenizer` decodes the model's reply tokens."""
    grammar = LetterGrammar.for_tokenizer(tokenizer)
    opened = tokenizer.decode(grammar.open)
    befores = set()
    for i, c in enumerate(LETTERS):
        text = tokenizer.decode(grammar.open + grammar.sep + [grammar.letter_ids[i]])
        if not text.startswith(opened) or not text.endswith(c):
            raise UserError(f"tokenizer: the letter token of {c!r} decodes as {text!r} after {opened!r}")
        befores.add(text[len(opened):-1])
    if len(befores) != 1:
        raise UserError(f"tokenizer: letters are written after different prefixes {sorted(befores)!r}")
    pieces = ReplyPieces(opened, befores.pop(), tokenizer.decode(grammar.close))
    sample, _ = grammar.reply([LETTERS.index(c) for c in "crane"])
    if tokenizer.decode(sample[:-1]) != pieces.reply("crane"):
        raise UserError(f"tokenizer: the reply {tokenizer.decode(sample[:-1])!r} is not {pieces.reply('crane')!r}")
    return pieces


def literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def char_class(letters: str) -> str:
    """Sorted lowercase letters as a GBNF character class, runs of 3 or more written as ranges: [a-ce]."""
    codes, parts, i = sorted({ord(c) for c in letters}), [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        run = [chr(codes[k]) for k in range(i, j + 1)]
        parts.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else "".join(run))
        i = j + 1
    return "[" + "".join(parts) + "]"


def header(mode: str, pieces: ReplyPieces, extra: str = "", writer: str = "wordle-mlx export") -> str:
    return (f"# GBNF grammar of the Wordle player's reply in {mode} decoding, written by `{writer}`.\n"
            f"# A reply: {pieces.reply('crane')!r}.{extra}")


def grammar_gbnf(pieces: ReplyPieces) -> str:
    """`grammar` decoding: the tags, and 5 letters a-z each after its prefix."""
    letter = (literal(pieces.before) + " " if pieces.before else "") + "[a-z]"
    return (header("grammar", pieces, " The letters are any a-z: the word list is not enforced.") + "\n"
            + f"root ::= {literal(pieces.open)} letter letter letter letter letter {literal(pieces.close)}\n"
            + f"letter ::= {letter}\n")


def words_gbnf(words: Collection[str], pieces: ReplyPieces, board: Collection[str] | None = None) -> str:
    """`words` decoding: the tags around the letters of one of `words` (5 letters a-z each) that is not on the
    `board` (None: a grammar for every turn), as shared-subtree trie rules `pN-K` (the letters from position N on)."""
    words = sorted(set(words) - set(board or ()))
    bad = next((w for w in words if len(w) != 5 or not set(w) <= set(LETTERS)), None)
    if bad is not None or not words:
        raise UserError(f"words: {bad!r} is not 5 letters a-z" if bad is not None else "words: the list is empty")
    rules: list[list[str]] = [[] for _ in range(5)]      # position -> rule bodies
    ids: list[dict] = [{} for _ in range(5)]             # position -> {edges: rule number}
    before = literal(pieces.before) + " " if pieces.before else ""

    def build(endings: list[str], position: int) -> str | None:
        if position == 5:
            return None
        by_letter = defaultdict(list)
        for e in endings:
            by_letter[e[0]].append(e[1:])
        by_child = defaultdict(str)
        for c in sorted(by_letter):
            by_child[build(by_letter[c], position + 1)] += c
        edges = tuple(sorted((letters, child or "") for child, letters in by_child.items()))
        if edges not in ids[position]:
            ids[position][edges] = len(rules[position])
            alternatives = [char_class(letters) + (" " + child if child else "") for letters, child in edges]
            body = alternatives[0] if len(alternatives) == 1 else "( " + " | ".join(alternatives) + " )"
            rules[position].append(before + body)
        return f"p{position}-{ids[position][edges]}"

    start = build(words, 0)
    said = (f" The letters spell one of {len(words)} allowed guesses; a grammar cannot rule out the words already "
            "on the board." if board is None else
            f" The letters spell one of {len(words)} allowed guesses, the board's words ({', '.join(sorted(board)) or 'none'}) "
            "ruled out.")
    lines = [header("words", pieces, said, "wordle-mlx export" if board is None else "wordle-mlx grammar"),
             f"root ::= {literal(pieces.open)} {start} {literal(pieces.close)}"]
    for position in range(5):
        lines += [f"p{position}-{k} ::= {body}" for k, body in enumerate(rules[position])]
    return "\n".join(lines) + "\n"


def reply_gbnf(mode: str, pieces: ReplyPieces, words: Collection[str], board: Collection[str] | None = None) -> str:
    """The grammar of one decoding mode; in words decoding, the allowed `words` minus the `board`'s (None: the
    grammar file for every turn)."""
    if mode == "grammar":
        return grammar_gbnf(pieces)
    if mode == "words":
        return words_gbnf(words, pieces, board)
    raise UserError(f"decode: {mode!r} has no grammar; use {', '.join(GRAMMAR_MODES)}")


def reply_token_ids(tokenizer) -> list[int]:
    """Every token wordle-mlx's grammar and words decoders can write in a reply: the tags' tokens, the separator
    before a letter (none for Gemma), the 26 letter tokens and the end (`<end_of_turn>`), sorted."""
    grammar = LetterGrammar.for_tokenizer(tokenizer)
    return sorted({*grammar.open, *grammar.sep, *grammar.letter_ids, *grammar.close, grammar.end})


def banned_token_ids(tokenizer, vocab_size: int) -> list[int]:
    """The tokens of a `vocab_size` vocabulary outside `reply_token_ids`: banned by the logit bias that keeps
    llama.cpp to the decoder's own spelling (a grammar constrains text, so without it llama.cpp may spell a
    letter as a bare space and a letter, a path wordle-mlx never takes)."""
    keep = reply_token_ids(tokenizer)
    if keep[-1] >= vocab_size:
        raise UserError(f"tokenizer: reply token {keep[-1]} is outside the {vocab_size}-token vocabulary")
    banned = np.ones(vocab_size, dtype=bool)
    banned[keep] = False
    return np.flatnonzero(banned).tolist()


def logit_bias_json(banned: list[int]) -> str:
    """The banned tokens as llama-server's `logit_bias` value, `[[id, false], ...]` (false: never sampled)."""
    return "[" + ",".join(f"[{t},false]" for t in banned) + "]\n"


# --- a matcher for the GBNF written above ----------------------------------------------------------------
TOKEN = re.compile(r'\s+|#[^\n]*|(?P<name>[a-zA-Z0-9-]+)|(?P<lit>"(?:\\.|[^"\\])*")|(?P<cls>\[(?:\\.|[^\]\\])*\])'
                   r"|(?P<op>::=|[|()])")


def unescape(body: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r", "t": "\t"}.get(m.group(1), m.group(1)), body)


class GbnfMatcher:
    """Parses GBNF rules (`name ::= alternatives`, one rule per line, no repetition operators) and tells whether
    `root` matches a whole text. Raises UserError naming the line of a malformed rule."""

    def __init__(self, text: str, source: str = "grammar"):
        self.rules: dict[str, list[list[tuple[str, object]]]] = {}
        for lineno, line in enumerate(text.splitlines(), start=1):
            tokens = self.tokens(line, f"{source}:{lineno}")
            if not tokens:
                continue
            if len(tokens) < 3 or tokens[0][0] != "name" or tokens[1] != ("op", "::="):
                raise UserError(f"{source}:{lineno}: expected 'name ::= ...', got {line.strip()[:60]!r}")
            body, rest = self.alternatives(tokens[2:], f"{source}:{lineno}")
            if rest:
                raise UserError(f"{source}:{lineno}: unexpected {rest[0][1]!r}")
            self.rules[tokens[0][1]] = body
        for name, alts in self.rules.items():
            for kind, value in (item for alt in alts for item in self.flat(alt)):
                if kind == "ref" and value not in self.rules:
                    raise UserError(f"{source}: rule {name} refers to undefined rule {value!r}")
        if "root" not in self.rules:
            raise UserError(f"{source}: no root rule")

    @staticmethod
    def tokens(line: str, where: str) -> list[tuple[str, str]]:
        out, i = [], 0
        while i < len(line):
            m = TOKEN.match(line, i)
            if m is None:
                raise UserError(f"{where}: cannot read {line[i:i + 20]!r}")
            if m.lastgroup:
                out.append((m.lastgroup, m.group(m.lastgroup)))
            i = m.end()
        return out

    def alternatives(self, tokens, where):
        alts, seq = [], []
        while tokens and tokens[0] != ("op", ")"):
            kind, value = tokens[0]
            tokens = tokens[1:]
            if (kind, value) == ("op", "|"):
                alts.append(seq)
                seq = []
            elif (kind, value) == ("op", "("):
                group, tokens = self.alternatives(tokens, where)
                if not tokens:
                    raise UserError(f"{where}: unclosed '('")
                tokens = tokens[1:]
                seq.append(("group", group))
            elif kind == "lit":
                seq.append(("lit", unescape(value[1:-1])))
            elif kind == "cls":
                seq.append(("cls", re.compile("[" + value[1:-1] + "]")))
            elif kind == "name":
                seq.append(("ref", value))
            else:
                raise UserError(f"{where}: unexpected {value!r}")
        alts.append(seq)
        return alts, tokens

    def flat(self, seq):
        for kind, value in seq:
            if kind == "group":
                for alt in value:
                    yield from self.flat(alt)
            else:
                yield kind, value

    def ends(self, seq, text: str, at: int) -> set[int]:
        """Every position where `seq` (a sequence of items) can end when matched from `at`."""
        positions = {at}
        for kind, value in seq:
            nxt = set()
            for p in positions:
                if kind == "lit":
                    if text.startswith(value, p):
                        nxt.add(p + len(value))
                elif kind == "cls":
                    if p < len(text) and value.fullmatch(text[p]):
                        nxt.add(p + 1)
                else:
                    for alt in (self.rules[value] if kind == "ref" else value):
                        nxt |= self.ends(alt, text, p)
            positions = nxt
            if not positions:
                break
        return positions

    def accepts(self, text: str) -> bool:
        return any(len(text) in self.ends(alt, text, 0) for alt in self.rules["root"])


def check_reply_gbnf(gbnf: str, pieces: ReplyPieces, source: str, sample: str = "crane") -> None:
    """The grammar reads, and accepts the reply of `sample` (a bug guard: only grammars that pass are written)."""
    if not GbnfMatcher(gbnf, source).accepts(pieces.reply(sample)):
        raise UserError(f"{source}: the grammar does not accept {pieces.reply(sample)!r}")

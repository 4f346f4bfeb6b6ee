"""`wordle-mlx grammar`: the GBNF grammar of one board's reply, for a llama.cpp client that plays turn by turn.

The grammar file `wordle-mlx export` writes is the same on every turn, so in words decoding it cannot rule out the
words already on the board, which wordle-mlx's words decoder does. This command writes the grammar of one board:
the allowed guesses minus the board's words (`--decode words`, the default), or the tags around any 5 letters
(`--decode grammar`, where the board changes nothing). The board is the guesses so far, comma-separated, each
optionally with its tiles (`crane:XYXXG`; the tiles are checked, and only the words matter to the grammar).
The reply's spelling (the tags, and what each letter token writes before its letter) is read off the model's
tokenizer (`--model`, only the tokenizer files are needed). The grammar goes to stdout, or to `--out`
(written to a temporary file, then renamed).
"""

from __future__ import annotations

import re

from ..config import StrictModel
from ..errors import UserError
from ..game.words import check_word, guess_list
from ..llm.model.models import tokenizer_for
from ..llm.play.gbnf import GRAMMAR_MODES, check_reply_gbnf, reply_gbnf, reply_pieces
from ..storage.fileio import write_text_atomic

TILES = re.compile(r"^[GYX]{5}$")


class GrammarConfig(StrictModel):
    board: str = ""                       # "crane,sloth" or "crane:XYXXG,sloth:XXGXX"; empty: the first turn
    model: str = "builtin:gemma-3-270m"   # whose tokenizer spells the reply
    decode: str = "words"
    out: str | None = None
    json_output: bool = False


def board_words(board: str, allowed: frozenset[str]) -> list[str]:
    """The words of a `--board` text, each an allowed guess; a malformed entry is a one-line error naming it."""
    words = []
    for entry in (e.strip() for e in board.split(",") if e.strip()):
        word, _, pattern = entry.partition(":")
        word = word.strip().lower()
        problem = check_word(word)
        if problem:
            raise UserError(f"--board: {entry!r}: {problem}")
        if word not in allowed:
            raise UserError(f"--board: {entry!r}: {word!r} is not an allowed guess")
        if pattern and not TILES.match(pattern.strip().upper()):
            raise UserError(f"--board: {entry!r}: tiles {pattern!r} are not 5 of G, Y, X (green, yellow, grey)")
        words.append(word)
    return words


def run(cfg: GrammarConfig) -> dict:
    if cfg.decode not in GRAMMAR_MODES:
        raise UserError(f"--decode: {cfg.decode!r} has no grammar; use {', '.join(GRAMMAR_MODES)}")
    if cfg.json_output and cfg.out is None:
        raise UserError("--json: give --out too (without it the grammar itself goes to stdout)")
    allowed = frozenset(guess_list())
    board = board_words(cfg.board, allowed)
    pieces = reply_pieces(tokenizer_for(cfg.model))
    gbnf = reply_gbnf(cfg.decode, pieces, allowed, board)
    check_reply_gbnf(gbnf, pieces, "grammar", sample=min(allowed - set(board)))
    if cfg.out is None:
        print(gbnf, end="")
    else:
        write_text_atomic(cfg.out, gbnf)
    return {"decode": cfg.decode, "board": board, "words": len(allowed - set(board)) if cfg.decode == "words" else None,
            "out": cfg.out, "bytes": len(gbnf.encode("utf-8"))}

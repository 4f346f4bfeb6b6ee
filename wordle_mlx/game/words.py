"""Word lists: the packaged originals, the NYT guess list, and user-supplied files.

The package ships the original (pre-NYT, January 2022) Wordle lists in `game/data/` with their
SOURCES.md: 2,315 answers and 12,972 allowed guesses (answers included), plus the later 14,855-word
NYT guess list. Every loader checks that each line is exactly five letters a-z and names the file and
line number of the first bad line. Lists are returned as sorted tuples of lowercase words.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

from ..errors import UserError

DATA_DIR = Path(__file__).resolve().parent / "data"
BUILTIN_LISTS = {
    "answers": DATA_DIR / "answers.txt",
    "allowed": DATA_DIR / "allowed.txt",
    "nyt": DATA_DIR / "allowed_nyt_14855.txt",
}
WORD_RE = re.compile(r"^[a-z]{5}$")


def check_word(word: str) -> str | None:
    """Why `word` is not a well-formed Wordle word, or None when it is 5 letters a-z."""
    if not isinstance(word, str):
        return f"not a string: {word!r}"
    if len(word) != 5:
        return f"{word!r} has {len(word)} letters, not 5"
    if not WORD_RE.match(word):
        return f"{word!r} has characters outside a-z"
    return None


def parse_word_lines(text: str, source: str) -> tuple[str, ...]:
    """Words from `text`, one per line; blank lines and '#' comments are skipped; case is folded."""
    words: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word = line.lower()
        problem = check_word(word)
        if problem:
            raise UserError(f"{source}:{lineno}: bad word {line!r}: {problem}")
        words.append(word)
    if not words:
        raise UserError(f"{source}: the word list is empty")
    return tuple(sorted(set(words)))


@functools.lru_cache(maxsize=16)
def load_word_list(spec: str) -> tuple[str, ...]:
    """A word list by name ('answers', 'allowed', 'nyt') or by path to a text file."""
    path = BUILTIN_LISTS.get(spec, Path(spec))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: word list not found (expected 'answers', 'allowed', 'nyt' or a file path)") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read word list: {exc.strerror}") from None
    return parse_word_lines(text, str(path))


def answers() -> tuple[str, ...]:
    return load_word_list("answers")


def allowed() -> tuple[str, ...]:
    return load_word_list("allowed")


def guess_list(answers_spec: str = "answers", allowed_spec: str = "allowed") -> tuple[str, ...]:
    """The allowed guesses, always including every answer."""
    return tuple(sorted(set(load_word_list(allowed_spec)) | set(load_word_list(answers_spec))))


def lists_hash(*lists: tuple[str, ...]) -> str:
    """A short content hash of word lists, used as a cache key."""
    digest = hashlib.sha256()
    for words in lists:
        digest.update("\n".join(words).encode())
        digest.update(b"\x00")
    return digest.hexdigest()[:16]

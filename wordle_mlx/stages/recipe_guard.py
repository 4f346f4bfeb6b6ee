"""The ship guard: does the adapter a recipe trained replace the one in the tree?

It compares two eval JSONs of the same games per setting, the new adapter's and the shipped one's, paired game by
game. An eval JSON records each game as `{secret, won, guesses, seeded}` (`stages/evaluate.py`): the first
`seeded` guesses are the board the game started from (seeded boards), so a game is keyed by its secret and those
guesses, and two evals pair only when they played the same keys (same split, board, games and seed). The rule
(issue 87, "the guard judges by the game's rule"):

- the primary setting, greedy empty-board games in the decoding the new adapter records (words for the recipe's
  adapters): the new adapter ships only when it wins at least as many games as the shipped one;
- every other setting (free decoding, seeded boards): the new adapter must not be significantly worse, where
  worse means fewer wins with McNemar's exact two-sided p < 0.05 over the discordant games (won by one side
  only: b by the new adapter, c by the shipped one; p = min(1, 2 * P[X <= min(b, c)]), X ~ Binomial(b + c, 1/2)).

`compare` gives one `Comparison` per setting (its `line()` is what the ship stage prints); `verdict` says why
not, or None to ship. Evals that cannot be compared (another split, temperature, board or decoding, other games)
are a reason not to ship, never a crash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from math import comb
from pathlib import Path

from ..config import display_path

ALPHA = 0.05


def mcnemar_p(b: int, c: int) -> float:
    """McNemar's exact two-sided p-value for b and c discordant pairs (1.0 when there are none)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def eval_decode(e: dict) -> str:
    """An eval JSON's decoding (evals made before decoding modes say `constrain` for words, nothing for free)."""
    return e.get("decode") or ("words" if e.get("constrain") else "free")


def game_key(record: dict) -> tuple:
    """A game as two evals of the same games share it: the secret and the seeded board it started from."""
    return record["secret"], tuple(record.get("guesses", [])[: record.get("seeded", 0)])


class NotComparable(Exception):
    """Two evals that did not play the same games the same way (the message says how)."""


@dataclass(frozen=True)
class Comparison:
    setting: str
    primary: bool
    games: int
    new_wins: int
    shipped_wins: int
    new_only: int          # b: games only the new adapter won
    shipped_only: int      # c: games only the shipped adapter won

    @property
    def p(self) -> float:
        return mcnemar_p(self.new_only, self.shipped_only)

    @property
    def worse(self) -> bool:
        """Whether this setting keeps the shipped adapter."""
        if self.primary:
            return self.new_wins < self.shipped_wins
        return self.new_wins < self.shipped_wins and self.p < ALPHA

    def rule(self) -> str:
        return ("at least as many wins" if self.primary else
                f"not significantly worse: fewer wins with p < {ALPHA}")

    def line(self) -> str:
        return (f"guard {self.setting}: new {self.new_wins} / {self.games}, shipped {self.shipped_wins} / "
                f"{self.games}; won by new only {self.new_only}, by shipped only {self.shipped_only}; McNemar p "
                f"{self.p:.3g} -> {'KEEP the shipped adapter' if self.worse else 'ok'} ({self.rule()})")


def read_eval(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError:
        raise NotComparable(f"{path} is missing") from None
    except ValueError as err:
        raise NotComparable(f"{path}: not JSON ({err})") from None


def compare(setting: str, primary: bool, new_path: Path, shipped_path: Path) -> Comparison:
    """The two evals of one setting, paired game by game; NotComparable when they did not play the same games."""
    new_path, shipped_path = Path(display_path(new_path.resolve())), Path(display_path(shipped_path.resolve()))
    new, old = read_eval(new_path), read_eval(shipped_path)
    history = "seeded" if setting == "seeded" else "none"
    for key, want in (("split", "test"), ("history", history), ("temperature", 0.0)):
        for name, e in ((new_path, new), (shipped_path, old)):
            if e.get(key) != want:
                raise NotComparable(f"{name}: {key} is {e.get(key)!r}, the guard's {setting} setting compares "
                                    f"{key} {want!r}")
    if eval_decode(new) != eval_decode(old):
        raise NotComparable(f"{new_path} decodes {eval_decode(new)}, {shipped_path} {eval_decode(old)}: the guard "
                            "compares the same decoding")
    records = []
    for name, e in ((new_path, new), (shipped_path, old)):
        games = e.get("game_records") or []
        by_key = {game_key(g): bool(g["won"]) for g in games}
        if len(by_key) != len(games) or len(games) != e.get("games"):
            raise NotComparable(f"{name}: {len(games)} game records for {e.get('games')} games, "
                                f"{len(by_key)} distinct: the guard pairs games by secret and board")
        records.append(by_key)
    if records[0].keys() != records[1].keys():
        raise NotComparable(f"{new_path} and {shipped_path} played different games ({new['games']} and "
                            f"{old['games']}; {len(records[0].keys() ^ records[1].keys())} not in both)")
    pairs = [(records[0][k], records[1][k]) for k in records[0]]
    return Comparison(setting, primary, len(pairs), sum(a for a, _ in pairs), sum(b for _, b in pairs),
                      sum(a and not b for a, b in pairs), sum(b and not a for a, b in pairs))


def verdict(comparisons: list[Comparison]) -> str | None:
    """None when the new adapter ships, else why not (one line)."""
    for c in comparisons:
        if c.worse:
            how = (f"fewer wins ({c.new_wins} against {c.shipped_wins})" if c.primary else
                   f"significantly fewer wins ({c.new_wins} against {c.shipped_wins}, McNemar p {c.p:.3g})")
            return f"the new adapter has {how} in the guard's {c.setting} setting"
    return None

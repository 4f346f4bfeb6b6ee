"""Play a set of games and score them: the one path of `wordle-mlx eval` and of SFT's and GRPO's validation.

`play_scored(model, tokenizer, specs, cfg, allowed, world)` plays the games with the rollout engine
(`rollout.play_games`), each rank its share when a `world` of several ranks is given, and returns a
`ScoredGames`: this rank's episodes, every game's record (`Episode.outcome`: secret, won, guesses, seeded) in the
games' order, and the counts behind the rates (`game_counts`, added over ranks by `rates_from_counts`): win rate,
mean guesses on wins, format errors and invalid words over all replies, repeats over played guesses. Eval
summarises the same episodes in more detail; the win counts of all three agree because they come from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Sequence

import numpy as np

from .episode import Episode, Turn
from .prompts import FORMAT_ERRORS, NOT_A_WORD
from .rollout import GameSpec, RolloutConfig, play_games


def game_counts(episodes: Sequence[Episode], replies: Sequence[Turn]) -> dict:
    """The raw counts behind a batch of games' rates; counts from several ranks add up (`rates_from_counts`)."""
    return {"games": len(episodes), "won_guesses": [len(ep.state.guesses) for ep in episodes if ep.won],
            "replies": len(replies), "format_errors": sum(1 for t in replies if t.error in FORMAT_ERRORS),
            "invalid": sum(1 for t in replies if t.error == NOT_A_WORD),
            "repeated": sum(1 for ep in episodes for t in ep.turns if t.repeated),
            "played": sum(1 for ep in episodes for t in ep.turns if t.error is None)}


def rates_from_counts(parts: Sequence[dict]) -> dict:
    """win_rate, mean_guesses (won games, board guesses included), and rates as in `eval`: format errors and
    invalid words (well-formed, not allowed) over all replies, repeats over played guesses; over the union of
    the games behind several `game_counts` results."""
    games = sum(p["games"] for p in parts)
    won = [g for p in parts for g in p["won_guesses"]]
    n = max(1, sum(p["replies"] for p in parts))
    played = sum(p["played"] for p in parts)
    return {
        "win_rate": len(won) / games if games else 0.0,
        "mean_guesses": float(np.mean(won)) if won else None,
        "format_error_rate": sum(p["format_errors"] for p in parts) / n,
        "invalid_rate": sum(p["invalid"] for p in parts) / n,
        "repeat_rate": sum(p["repeated"] for p in parts) / played if played else 0.0,
    }


def interleave(per_rank: Sequence[list]) -> list:
    """Undo `World.shard`: item k of rank r goes back to global position r + k * size."""
    out, k = [], 0
    while any(k < len(part) for part in per_rank):
        out.extend(part[k] for part in per_rank if k < len(part))
        k += 1
    return out


@dataclass
class ScoredGames:
    episodes: list[Episode]            # this rank's games
    records: list[dict]                # every rank's game records, in the games' order
    counts: list[dict]                 # every rank's `game_counts`

    @property
    def rates(self) -> dict:
        return rates_from_counts(self.counts)


def play_scored(model, tokenizer, specs: Sequence[GameSpec], cfg: RolloutConfig, allowed: Collection[str],
                world=None, progress: Callable | None = None, deadline: float | None = None) -> ScoredGames:
    """Play `specs` greedily or as `cfg` says, each rank its share (`world.shard`), and gather every game's
    record and counts on every rank."""
    mine = world.shard(list(specs)) if world is not None else list(specs)
    episodes = play_games(model, tokenizer, mine, cfg, allowed, progress=progress, deadline=deadline) if mine else []
    replies = [t for ep in episodes for t in ep.turns]
    own = {"counts": game_counts(episodes, replies), "games": [ep.outcome() for ep in episodes]}
    parts = world.gather_json(own, "all_gather of validation games") if world is not None else [own]
    return ScoredGames(episodes, interleave([p["games"] for p in parts]), [p["counts"] for p in parts])


def validation_record(model, tokenizer, games: dict[str, list[GameSpec]], cfg: RolloutConfig,
                      allowed: Collection[str], world=None) -> dict:
    """Play the validation games of each kind (e.g. "empty", "seeded") and return the `valid` record's fields: the
    rates over all of them, each kind's win rate beside (`win_rate_<kind>`), and every
    game's record."""
    record, counts, outcomes = {}, [], []
    for kind, specs in games.items():
        scored = play_scored(model, tokenizer, specs, cfg, allowed, world)
        counts += scored.counts
        outcomes += scored.records
        record[f"win_rate_{kind}"] = scored.rates["win_rate"]
    return {**rates_from_counts(counts), **record, "games": outcomes}

"""`wordle-mlx eval`: play the first N held-out words with a model and report the eval JSON.

The secrets are the first `games` words of a fixed split (`game/splits.py`, test by default, in the
split's order). With `history="seeded"` each game starts from 0-4 earlier guesses drawn by
`game/seeding.eval_board` (`seed_history` with `history_rng(seed, secret)`), so every game's board depends only on
the seed and the secret. The model plays all games in lockstep with the rollout engine (`llm/play/games.py`,
the path SFT's and GRPO's validation play too); the entropy
solver plays the same boards; with an adapter, the base model (adapter off) plays them too. The result
(docs/METRICS.md "Eval JSON") has the win rate with its Wilson 95% interval, mean guesses on wins
(seeded guesses included), the 1-6/lost histogram, error and behaviour rates and token throughput.
Rates: format_error_rate and invalid_rate (well-formed but not an allowed word) are over all model
turns; repeat_rate and consistent_rate are over played guesses. With temperature 0 and the same seed,
two runs give the same JSON except the timing fields (`seconds`, `tokens_per_second`). `timeout` bounds
the whole run: when it runs out, the partial result is written with the unfinished games named and the
command fails.
"""

from __future__ import annotations

import math
import sys
import time
from rich.table import Table

from ..config import display_path, resolve_path
from ..errors import UserError
from ..storage.fileio import write_json_atomic
from ..game.knowledge import is_consistent
from ..game.seeding import eval_board
from ..game.solver import Solver
from ..game.splits import split_words
from ..game.words import guess_list
from ..llm.model.models import load_model
from ..llm.play.prompts import FORMAT_ERRORS, NOT_A_WORD
from ..llm.play.reply_grammar import untrained_free_warning
from ..llm.play.games import play_scored
from ..llm.play.rollout import GameSpec, decode_mode
from ..runtime.progress import console, progress_bar
from .eval_config import EvalConfig
from .pattern_table import load_table

TIMING_KEYS = ("seconds", "tokens_per_second")


def wilson_interval(wins: int, n: int, z: float = 1.959963984540054) -> list[float]:
    """Wilson score 95% interval for a binomial proportion."""
    if n == 0:
        return [0.0, 1.0]
    p = wins / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def summarise(boards: list[dict], seconds: float) -> dict:
    """The eval metrics for played boards: {secret, guesses, won, turns: [{error, repeated, consistent, tokens}]}."""
    n = len(boards)
    wins = [b for b in boards if b["won"]]
    hist = {str(k): sum(1 for b in wins if len(b["guesses"]) == k) for k in range(1, 7)}
    hist["lost"] = n - len(wins)
    turns = [t for b in boards for t in b["turns"]]
    played = [t for t in turns if t["error"] is None]
    tokens = sum(t["tokens"] for t in turns)
    return {
        "games": n, "wins": len(wins), "win_rate": _rate(len(wins), n) or 0.0,
        "win_rate_ci95": wilson_interval(len(wins), n),
        "mean_guesses_on_wins": round(sum(len(b["guesses"]) for b in wins) / len(wins), 4) if wins else None,
        "histogram": hist,
        "format_error_rate": _rate(sum(t["error"] in FORMAT_ERRORS for t in turns), len(turns)),
        "invalid_rate": _rate(sum(t["error"] == NOT_A_WORD for t in turns), len(turns)),
        "repeat_rate": _rate(sum(bool(t["repeated"]) for t in played), len(played)),
        "consistent_rate": _rate(sum(bool(t["consistent"]) for t in played), len(played)),
        "mean_completion_tokens": _rate(tokens, len(turns)),
        "tokens_per_second": round(tokens / seconds, 3) if seconds > 0 else None,
        "tokens_per_game": _rate(tokens, n),
        "seconds": round(seconds, 3),
        "game_records": [{"secret": b["secret"], "won": b["won"], "guesses": b["guesses"], "seeded": b["seeded"]}
                         for b in boards],
    }


def episode_board(ep) -> dict:
    turns = [{"error": t.error, "repeated": t.repeated, "consistent": t.consistent,
              "tokens": len(t.completion_tokens)} for t in ep.turns]
    return {"secret": ep.secret, "guesses": list(ep.state.guesses), "won": ep.won, "seeded": len(ep.seeded),
            "turns": turns, "timed_out": ep.timed_out}


def solver_board(solver: Solver, spec: GameSpec) -> dict:
    guesses = solver.play(spec.secret, history=list(spec.seeded_guesses))
    turns, history = [], [(g, solver.pattern(g, spec.secret)) for g in spec.seeded_guesses]
    for g in guesses[len(spec.seeded_guesses):]:
        turns.append({"error": None, "repeated": g in [h for h, _ in history],
                      "consistent": is_consistent(g, history), "tokens": 0})
        history.append((g, solver.pattern(g, spec.secret)))
    return {"secret": spec.secret, "guesses": guesses, "won": guesses[-1] == spec.secret,
            "seeded": len(spec.seeded_guesses), "turns": turns}


def game_specs(cfg: EvalConfig, solver: Solver) -> list[GameSpec]:
    words = split_words(cfg.split)
    if cfg.games > len(words):
        raise UserError(f"--games: {cfg.games} is more than the {len(words)} words of the {cfg.split} split")
    specs = []
    for secret in words[: cfg.games]:
        seeded = [] if cfg.history == "none" else eval_board(secret, cfg.seed, solver)
        specs.append(GameSpec(secret=secret, seeded_guesses=seeded))
    return specs


def play_model(cfg: EvalConfig, specs: list[GameSpec], adapter: str | None, allowed: frozenset,
               label: str, deadline: float | None) -> tuple[dict, list[dict]]:
    model, tokenizer = load_model(cfg.model, adapter_path=adapter, dtype=cfg.dtype)
    rollout = cfg.rollout.model_copy(update={"seed": cfg.seed})
    start = time.perf_counter()
    with progress_bar(label, len(specs), enabled=cfg.progress and not cfg.json_output) as advance:
        scored = play_scored(model, tokenizer, specs, rollout, allowed, progress=advance, deadline=deadline)
    boards = [episode_board(ep) for ep in scored.episodes]
    return summarise(boards, time.perf_counter() - start), boards


def show(result: dict) -> None:
    columns = {"model": result, **result.get("baselines", {})}
    table = Table(title=f"eval: {result['model']} on {result['games']} {result['split']} words "
                        f"(history {result['history']}, temperature {result['temperature']}, "
                        f"{result['decode']} decoding)")
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")

    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, list):
            return f"[{v[0]:.3f}, {v[1]:.3f}]"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    for key in ("wins", "win_rate", "win_rate_ci95", "mean_guesses_on_wins", "format_error_rate", "invalid_rate",
                "repeat_rate", "consistent_rate", "mean_completion_tokens", "tokens_per_game", "tokens_per_second",
                "seconds"):
        table.add_row(key, *(fmt(c.get(key)) for c in columns.values()))
    table.add_row("histogram 1-6/lost", *(" ".join(str(v) for v in c["histogram"].values())
                                         for c in columns.values()))
    console.print(table)


def run(cfg: EvalConfig) -> dict:
    deadline = time.monotonic() + cfg.timeout if cfg.timeout else None
    adapter = str(resolve_path(cfg, cfg.adapter)) if cfg.adapter else None
    if adapter is not None:    # the prompts and decoding the adapter was trained for, unless rollout sets them
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.for_adapter(adapter)})
        warning = untrained_free_warning(adapter, decode_mode(cfg.rollout))
        if warning:
            print(warning, file=sys.stderr)
    solver = Solver(load_table(show_progress=cfg.progress and not cfg.json_output))
    allowed = frozenset(guess_list())
    specs = game_specs(cfg, solver)

    summary, boards = play_model(cfg, specs, adapter, allowed, "eval", deadline)
    result = {"kind": "eval", "model": cfg.model, "adapter": display_path(adapter) if adapter else None,
              "split": cfg.split,
              "history": cfg.history, "temperature": cfg.rollout.temperature, "seed": cfg.seed,
              "max_tokens_per_turn": cfg.rollout.max_tokens_per_turn, "prompt": cfg.rollout.prompt.model_dump(),
              "decode": decode_mode(cfg.rollout), **summary}
    unfinished = [(i, b) for i, b in enumerate(boards) if b["timed_out"]]
    if cfg.baselines and not unfinished:
        start = time.perf_counter()
        solver_boards = [solver_board(solver, spec) for spec in specs]
        result["baselines"] = {"solver": summarise(solver_boards, time.perf_counter() - start)}
        if adapter is not None:
            base, base_boards = play_model(cfg, specs, None, allowed, "base model", deadline)
            unfinished = [(i, b) for i, b in enumerate(base_boards) if b["timed_out"]]
            result["baselines"]["base_model"] = base
        else:  # no adapter: the model played *is* the base model; report it there too instead of replaying
            result["baselines"]["base_model"] = {**summary, "same_as_model": True}
    if unfinished:
        result["timed_out"] = True
        result["unfinished"] = [{"index": i, "secret": b["secret"], "guesses": b["guesses"]} for i, b in unfinished]
    if cfg.out:
        write_json_atomic(resolve_path(cfg, cfg.out), result)
    if unfinished:
        i, b = unfinished[0]
        raise UserError(f"eval timed out after {cfg.timeout:g} s: {len(unfinished)} game(s) unfinished, the first "
                        f"is game {i} (secret {b['secret']!r}, {len(b['guesses'])} guesses on the board)")
    if not cfg.json_output:
        show(result)
    return result

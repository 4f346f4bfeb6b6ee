"""`wordle-mlx dagger`: SFT data on the boards the model itself reaches, labelled by the teacher (DAgger).

Imitation data (`wordle-mlx data`) only holds boards on the teacher's own path, so a model that strays
from it (a different second guess, a non-word, a retry after "XXXXX is not in the word list") meets
boards it never trained on. This stage plays `train_games` train secrets and `valid_games` valid
secrets with the model (rollout engine, greedy by default) and records every board the model was asked
to move on, retries included, with the teacher's reply for that board as the target: the same teacher
as `wordle-mlx data` (best-splitting candidate under `candidate_threshold`, else the entropy solver;
think text from `game/thinking.py`). This is one round of DAgger (Ross, Gordon & Bagnell, 2011): the
state distribution is the learner's, the labels are the expert's. The records are in `data`'s chat
JSONL schema (meta mode `on_policy`, plus the model's own reply) and pass the same replay check; with
`base_data`, that folder's train/valid records are included first, so `wordle-mlx sft` trains on the
mix. Secrets are the first words of a seeded shuffle of the train (valid) split, never test words.
"""

from __future__ import annotations

import random

from pydantic import Field, model_validator

from ..config import MODEL_SPEC_HELP, StrictModel, resolve_path
from ..errors import UserError
from ..game.feedback import feedback
from ..game.solver import Solver
from ..game.splits import split_answers
from ..game.state import MAX_GUESSES
from ..game.thinking import ThinkStyle, think_text
from ..game.words import guess_list
from ..llm.prompts import TurnText, build_messages, format_reply
from ..llm.rollout import GameSpec, RolloutConfig, play_games
from ..progress import console, progress_bar
from .data import read_sft_jsonl, teacher_guess, write_checked_sft
from .entropy import load_table


class DaggerConfig(StrictModel):
    model: str = Field("builtin:gemma-3-270m", description=MODEL_SPEC_HELP)
    adapter: str | None = Field(None, description="LoRA adapter folder of the model that plays.")
    dtype: str | None = None
    out: str = Field(..., description="Output folder for train.jsonl, valid.jsonl and stats.json.")
    base_data: str | None = Field(None, description="SFT data folder whose train/valid records are included too.")
    train_games: int = Field(400, ge=0, description="Games played on train secrets.")
    valid_games: int = Field(50, ge=0, description="Games played on valid secrets.")
    copies: int = Field(1, ge=1, description="Each on-policy record is written this many times.")
    only_disagreements: bool = Field(False, description="Keep only boards where the model's reply was not the "
                                     "teacher's (an invalid reply or another word).")
    seed: int = Field(0, ge=0, lt=2 ** 32, description="Which secrets are played, the shuffle, and sampling.")
    candidate_threshold: int = Field(100000, ge=1, description="Teacher: with at most this many candidates, play "
                                     "the best-splitting one (as in `data`).")
    think_style: ThinkStyle = "none"
    max_named: int = Field(5, ge=0)
    rollout: RolloutConfig = Field(default_factory=lambda: RolloutConfig(temperature=0.0, max_tokens_per_turn=16))
    progress: bool = True

    @model_validator(mode="after")
    def _no_constraint(self) -> "DaggerConfig":
        if self.rollout.constrain:
            raise ValueError("rollout.constrain: collect the boards the unconstrained model reaches")
        return self


def secrets_for(split: list[str], n: int, seed: int, name: str) -> list[str]:
    """The first `n` words of a seeded shuffle of one split."""
    if n > len(split):
        raise UserError(f"dagger: {name}_games {n} is more than the {len(split)} words of the {name} split")
    order = sorted(split)
    random.Random(f"wordle-mlx-dagger|{seed}|{name}").shuffle(order)
    return order[:n]


def played_secrets(cfg, splits: dict[str, list[str]]) -> dict[str, list[str]]:
    """The secrets a DAgger or self-choice round (`cfg`: its config) plays, train then valid: the first
    `train_games` / `valid_games` (None: the whole split) of a seeded shuffle of the split."""
    return {split: secrets_for(splits[split], len(splits[split]) if n is None else n, cfg.seed, split)
            for split, n in (("train", cfg.train_games), ("valid", cfg.valid_games))}


def episode_records(ep, cfg: DaggerConfig, solver: Solver) -> list[dict]:
    """One record per model turn of `ep`: that turn's prompt (board and last error) with the teacher's reply."""
    records, played, last_error, texts = [], [], None, []
    for turn in ep.turns:
        history = [(g, feedback(g, ep.secret)) for g in played]
        guess = teacher_guess(solver, solver.candidate_columns(history), cfg.candidate_threshold)
        cands = [solver.table.answers[c] for c in solver.candidate_columns(history)]
        think = think_text(history, cands, guess, cfg.think_style, cfg.max_named)
        messages = build_messages(cfg.rollout.prompt, history, texts, MAX_GUESSES, last_error=last_error)
        messages.append({"role": "assistant", "content": format_reply(think, guess, False,
                                                                      cfg.rollout.prompt.guess_format)})
        meta = {"secret": ep.secret, "history": list(played), "seeded": 0, "mode": "on_policy", "target": guess,
                "model_guess": turn.guess, "model_error": turn.error}
        if last_error is not None:
            meta["retry_error"] = list(last_error)
        if not (cfg.only_disagreements and turn.error is None and turn.guess == guess):
            records.append({"messages": messages, "meta": meta})
        texts.append(TurnText(reply=turn.text, guess=turn.guess, pattern=turn.pattern, error=turn.error))
        if turn.error is None:
            played.append(turn.guess)
            last_error = None
        else:
            last_error = (turn.error, turn.guess)
    return records


def run(cfg: DaggerConfig) -> dict:
    from ..llm.models import load_model

    if cfg.rollout.prompt.context != "summary":
        raise UserError(f"dagger: rollout.prompt.context must be 'summary', not {cfg.rollout.prompt.context!r} "
                        "(a conversation replays the model's own replies, which are not the teacher's)")
    out = resolve_path(cfg, cfg.out).resolve()
    adapter = str(resolve_path(cfg, cfg.adapter)) if cfg.adapter else None
    if adapter is not None:
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.for_adapter(adapter)})
    base = {}
    if cfg.base_data is not None:
        folder = resolve_path(cfg, cfg.base_data)
        for split in ("train", "valid"):
            if not (folder / f"{split}.jsonl").is_file():
                raise UserError(f"dagger: base_data {folder}: no {split}.jsonl (run `wordle-mlx data` first)")
            base[split] = read_sft_jsonl(folder / f"{split}.jsonl")
    solver = Solver(load_table(show_progress=cfg.progress))
    splits = split_answers(solver.table.answers)
    allowed = frozenset(guess_list())
    model, tokenizer = load_model(cfg.model, adapter_path=adapter, dtype=cfg.dtype)
    rollout = cfg.rollout.model_copy(update={"seed": cfg.seed})

    data, stats = {}, {"model": cfg.model, "adapter": cfg.adapter, "seed": cfg.seed,
                       "prompt": cfg.rollout.prompt.model_dump(), "temperature": cfg.rollout.temperature}
    for split, secrets in played_secrets(cfg, splits).items():
        assert not set(secrets) & set(splits["test"]), "dagger secrets overlap the test split"
        with progress_bar(f"dagger {split}", len(secrets), enabled=cfg.progress) as advance:
            episodes = play_games(model, tokenizer, [GameSpec(s) for s in secrets], rollout, allowed,
                                  progress=advance)
        records = [r for ep in episodes for r in episode_records(ep, cfg, solver)]
        stats[split] = {"games": len(episodes), "model_wins": sum(ep.won for ep in episodes),
                        "boards": len(records), "retry_boards": sum("retry_error" in r["meta"] for r in records),
                        "model_agreed": sum(r["meta"]["model_guess"] == r["meta"]["target"] for r in records),
                        "base_records": len(base.get(split, []))}
        mixed = list(base.get(split, [])) + [r for r in records for _ in range(cfg.copies)]
        random.Random(f"wordle-mlx-dagger|{cfg.seed}|{split}|mix").shuffle(mixed)
        data[split] = mixed

    split_sets = {name: set(words) for name, words in splits.items()}
    write_checked_sft(out, data, stats, cfg.rollout.prompt, set(allowed), split_sets,
                      check=lambda r: r["meta"].get("mode") == "on_policy",   # base records were checked by `data`
                      think_style=cfg.think_style)
    if cfg.progress:
        for split in data:
            s = stats[split]
            console.print(f"dagger {split}: model won {s['model_wins']}/{s['games']}, {s['boards']} boards "
                          f"({s['retry_boards']} retries, model agreed on {s['model_agreed']}), "
                          f"{len(data[split])} records with base")
    return {"out": str(out), **stats}

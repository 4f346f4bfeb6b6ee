"""The recipe file (`config/recipe.json`): the stages of a training chain, each with only what differs from its
stage's config defaults, validated strictly and expanded into a flat list of named steps.

A recipe lists stages in order. Each has a `kind` (model, entropy, data, sft, grpo, self-play, cover, eval, fuse,
plots, ship) and a `stage` name; `config` holds the differences from that kind's config defaults (`DataConfig`,
`SFTConfig`, `GRPOConfig`, `ChoiceConfig`, `CoverConfig`, `EvalConfig`, `EntropyConfig`), never a path: run
names, data folders and adapters are derived from stage names and the model (`recipe_build.py`, which refuses a
recipe that sets one). A training or
self-play stage starts from the adapter of the training stage before it (`start` names another one, or null for
none); an SFT stage reads the data of the data, self-play or cover stage before it, a cover stage the data of the
self-play stage before it. A `rounds` entry repeats its stages `count` times: round r of a stage is named `stage`
followed by number_from + r - 1 (no number when that is 1), `per_round` gives a dotted config field one value per
round, and `rounds` limits a stage to some rounds. `models` limits a stage to some model sizes (270m, 4b, ...).
An eval entry plays each of its `players` (names of `players`: a training stage's adapter, the fuse stage's model,
or the base model) in one `setting`. `load_recipe` turns any problem into one line naming the file, the field and
the value; `expand` gives the steps for one model size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, ValidationError, field_validator

from ..config import StrictModel, read_json_file
from ..errors import UserError

PREVIOUS = "previous"       # `start`: the training stage before this one
EVAL_SETTINGS = ("greedy", "sampled", "seeded", "free", "words")
SHIP_GUARDS = ("words", "free", "grammar", "seeded")


def _short(value: Any, limit: int = 60) -> str:
    """A value as an error line shows it (as `config.format_validation_error` does)."""
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class StageEntry(StrictModel):
    stage: str = Field(pattern=r"^[a-z][a-z0-9-]*$", description="The stage's name (markers, run names, folders).")
    models: list[str] | None = Field(None, description="Only for these model sizes (270m, 4b, ...); None: all.")
    rounds: list[int] | None = Field(None, description="Inside a rounds entry: only in these rounds (1 = first).")
    number_from: int = Field(1, ge=1, description="Inside a rounds entry: the number round 1 carries in the name.")
    per_round: dict[str, list[Any]] = Field({}, description="Inside a rounds entry: dotted config field -> one "
                                            "value per round.")
    config: dict[str, Any] = Field({}, description="What differs from the stage kind's config defaults.")


class ModelStage(StageEntry):
    kind: Literal["model"]


class EntropyStage(StageEntry):
    kind: Literal["entropy"]


class DataStage(StageEntry):
    kind: Literal["data"]


class TrainStage(StageEntry):
    kind: Literal["sft", "grpo"]
    start: str | None = Field(PREVIOUS, description="The training stage whose adapter this one starts from.")
    data: str | None = Field(None, description="SFT: the stage whose data it trains on (default: the last one).")


class SelfPlayStage(StageEntry):
    kind: Literal["self-play"]
    start: str | None = PREVIOUS


class CoverStage(StageEntry):
    kind: Literal["cover"]
    data: str | None = Field(None, description="The self-play stage it adds to (default: the last one).")


class FuseStage(StageEntry):
    kind: Literal["fuse"]
    start: str | None = PREVIOUS


class EvalStage(StageEntry):
    kind: Literal["eval"]
    stage: str = "eval"
    setting: Literal[EVAL_SETTINGS] = "greedy"
    players: list[str] = Field(min_length=1, description="Names of the recipe's `players`.")


class PlotsStage(StageEntry):
    kind: Literal["plots"]
    runs: dict[str, str] = Field({}, description="Plot folder name -> training stage whose metrics it charts.")
    compare: Literal[EVAL_SETTINGS] | None = Field("greedy", description="Compare every player's eval in this "
                                                   "setting (None: no comparison).")


class ShipStage(StageEntry):
    kind: Literal["ship"]
    start: str | None = PREVIOUS
    guard: list[Literal[SHIP_GUARDS]] = Field([], description="The settings in which the adapter in the tree "
                                              "plays the new one's test games (`recipe_guard.py`): greedy in a "
                                              "decoding (words, free, grammar) or seeded boards. In the decoding the "
                                              "new adapter records it must win at least as many, in the others it "
                                              "must not be significantly worse; empty: no guard.")
    config: dict[str, Any] = Field({}, description="The guard's evals of the shipped adapter: what differs from "
                                   "the eval config defaults.")


Leaf = Annotated[Union[ModelStage, EntropyStage, DataStage, TrainStage, SelfPlayStage, CoverStage, FuseStage,
                       EvalStage, PlotsStage, ShipStage], Field(discriminator="kind")]


class RoundsEntry(StrictModel):
    kind: Literal["rounds"]
    count: int = Field(ge=1, description="How many rounds.")
    stages: list[Leaf] = Field(min_length=1)


Entry = Annotated[Union[Leaf, RoundsEntry], Field(discriminator="kind")]


class RecipeFile(StrictModel):
    train_last_share: str | None = Field("1/3", description="SFT stages that start from an adapter train only the "
                                         "LoRA of the last share of the blocks, rounded up (None: all).")
    players: dict[str, str | None] = Field({}, description="Eval player name -> the stage whose adapter (a "
                                           "training stage) or model (fuse) it plays; None: the base model.")
    stages: list[Entry] = Field(min_length=1)

    @field_validator("train_last_share")
    @classmethod
    def _fraction(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                share = Fraction(value)
            except (ValueError, ZeroDivisionError):
                raise ValueError("expected a fraction such as 1/3") from None
            if not 0 < share <= 1:
                raise ValueError("expected a fraction in (0, 1]")
        return value

    def share(self) -> Fraction | None:
        return Fraction(self.train_last_share) if self.train_last_share else None


@dataclass
class Step:
    """One stage of the chain for one model: its name, its recipe entry, its round and its config differences."""
    name: str
    kind: str
    entry: StageEntry
    config: dict = field(default_factory=dict)
    round: int | None = None
    player: str | None = None          # eval steps: the player
    guard: str | None = None           # the shipped adapter's evals: the guard's setting


def clean_location(loc: tuple) -> str:
    """The dotted field path of a validation error, without the union tags pydantic inserts (stages.3.sft.x ->
    stages.3.x)."""
    tags = {"model", "entropy", "data", "sft", "grpo", "self-play", "cover", "fuse", "eval", "plots", "ship",
            "rounds"}
    parts, prev = [], None
    for p in loc:
        if isinstance(p, str) and p in tags and isinstance(prev, int):
            prev = p
            continue
        parts.append(str(p))
        prev = p
    return ".".join(parts)


def validation_line(err: ValidationError, source: str) -> str:
    """One line: `source: field.path: message (got value)`, as `config.format_validation_error` words it."""
    errors = err.errors()
    first = errors[0]
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "union_tag_invalid":
        msg = "unknown stage kind; expected " + first["ctx"]["expected_tags"]
    elif first["type"] == "union_tag_not_found":
        msg = "missing: every stage names its kind"
    got = first["input"].get("kind") if first["type"] == "union_tag_invalid" and isinstance(first["input"], dict) \
        else first.get("input")
    more = f" [and {len(errors) - 1} more error(s)]" if len(errors) > 1 else ""
    shown = f" (got {_short(got)})" if first["type"] != "missing" else ""
    where = clean_location(first["loc"]) + (".kind" if first["type"] in ("union_tag_invalid", "union_tag_not_found")
                                            else "")
    return f"{source}: {where.lstrip('.') or '(top level)'}: {msg}{shown}{more}"


def load_recipe(path: str | Path) -> RecipeFile:
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    try:
        recipe = RecipeFile.model_validate(data)
    except ValidationError as err:
        raise UserError(validation_line(err, str(path))) from None
    recipe._source = str(path)
    check_names(recipe, str(path))
    return recipe


def check_names(recipe: RecipeFile, source: str) -> None:
    """Per-round lists as long as their rounds, players that name stages, no two stages of one name."""
    for i, entry in enumerate(recipe.stages):
        inner = entry.stages if isinstance(entry, RoundsEntry) else [entry]
        for j, stage in enumerate(inner):
            where = f"stages.{i}" + (f".stages.{j}" if isinstance(entry, RoundsEntry) else "")
            count = entry.count if isinstance(entry, RoundsEntry) else None
            if count is None and (stage.per_round or stage.rounds or stage.number_from != 1):
                field_name = "per_round" if stage.per_round else "rounds" if stage.rounds else "number_from"
                raise UserError(f"{source}: {where}.{field_name}: only inside a rounds entry "
                                f"(got {_short(getattr(stage, field_name))})")
            for key, values in stage.per_round.items():
                if len(values) != count:
                    raise UserError(f"{source}: {where}.per_round.{key}: {count} values expected, one per round "
                                    f"(got {_short(values)})")
            for r in stage.rounds or []:
                if not 1 <= r <= (count or 0):
                    raise UserError(f"{source}: {where}.rounds: round {r} of {count} (got {_short(stage.rounds)})")
            for name in getattr(stage, "players", []):
                if name not in recipe.players:
                    raise UserError(f"{source}: {where}: player {name!r} is not in players (got {name!r})")


def set_dotted_copy(data: dict, dotted: str, value: Any) -> dict:
    """A deep-enough copy of `data` with the dotted field set."""
    out = dict(data)
    node, keys = out, dotted.split(".")
    for key in keys[:-1]:
        node[key] = dict(node.get(key) or {})
        node = node[key]
    node[keys[-1]] = value
    return out


def expand(recipe: RecipeFile, size: str) -> list[Step]:
    """The steps of the recipe for model size `size`, in order, each named once."""
    steps: list[Step] = []

    def add(stage: StageEntry, rnd: int | None) -> None:
        if stage.models is not None and size not in stage.models:
            return
        if isinstance(stage, EvalStage):
            for player in stage.players:
                steps.append(Step(f"eval-{player}-{stage.setting}", "eval", stage, dict(stage.config), rnd, player))
            return
        if isinstance(stage, ShipStage):
            for mode in stage.guard:
                steps.append(Step(f"eval-shipped-{mode}", "eval", stage, dict(stage.config), rnd, "shipped", mode))
        number = None if rnd is None else stage.number_from + rnd - 1
        name = stage.stage + (str(number) if number and number > 1 else "")
        config = dict(stage.config)
        for key, values in stage.per_round.items():
            config = set_dotted_copy(config, key, values[rnd - 1])
        steps.append(Step(name, stage.kind, stage, config, rnd))

    for entry in recipe.stages:
        if isinstance(entry, RoundsEntry):
            for rnd in range(1, entry.count + 1):
                for stage in entry.stages:
                    if stage.rounds is None or rnd in stage.rounds:
                        add(stage, rnd)
        else:
            add(entry, None)
    seen: set[str] = set()
    for step in steps:
        if step.name in seen:
            raise UserError(f"{recipe._source or 'recipe'}: stage {step.name!r} appears twice (got {step.name!r})")
        seen.add(step.name)
    return steps

"""Each step of a recipe turned into the stage config it runs and its `wordle-mlx` command, for one model.

`build_chain(recipe, settings, games, progress, ship_exists)` walks the expanded steps (`recipe_file.expand`) in
order and keeps what the chain has made so far: the last training stage (whose adapter the next training, self-play,
fuse or ship stage starts from, unless the step's `start` names another), the last data folder (what an SFT stage
trains on), the last self-play folder (what cover adds to) and the chain's prompt (the first data stage's). Every
config is the kind's Pydantic defaults, the recipe's differences, then what the chain derives: the model, the dtype
(only a `--dtype` given), paths (runs `logs/<stage>-<tag>`; data `<data root>/sft<suffix>` for a data stage
`data<suffix>`, `<data root>/<stage>` for self-play, `<input>-cover<max_candidates>c<copies>` for cover; evals
`logs/recipe-<tag>/eval_<player>_<setting>.json`: the shell recipe's names), `lora.train_layers` (the recipe's share
of the blocks, for an SFT stage that starts from an adapter), gradient checkpointing where the planner says a step
does not fit the memory budget (`recipe_model.needs_checkpointing`), and a quantized model's fuse dequantized. A GRPO
stage must validate (validation.every and games > 0): the trainer then plays the start adapter as step 0 and keeps
the pass with the most wins. The ship stage's config (`recipe_ship.ShipConfig`) lists the guard's pairs of evals,
every stage before it and the run's evals. Paths are relative to the working folder; `snapshot` writes every field
(but a decoding, prompt or reply length the chain left unset: the adapter's then) with paths relative to the
snapshot's folder (`config.config_relative_path`), which the stage's child process reads with `--config`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..config import config_relative_path, display_path, validate_config
from ..errors import UserError
from ..storage.fileio import write_json_atomic
from .choice_config import ChoiceConfig
from .cover import CoverConfig
from .data import DataConfig
from .entropy import EntropyConfig
from .eval_config import EvalConfig
from .fuse_config import FuseConfig
from .grpo_config import GRPOConfig
from .recipe_file import RecipeFile, Step, set_dotted_copy
from .recipe_model import ModelSettings, needs_checkpointing
from .recipe_ship import ShipConfig, write_config as write_ship_config
from .sft_config import SFTConfig

CONFIG_MODELS = {"data": DataConfig, "sft": SFTConfig, "grpo": GRPOConfig, "self-play": ChoiceConfig,
                 "cover": CoverConfig, "eval": EvalConfig, "entropy": EntropyConfig}
# the config fields that hold paths, per kind (written relative to the snapshot's folder)
PATH_FIELDS = {"data": ("out",), "sft": ("data.folder", "model.adapter", "run.logs_dir"),
               "grpo": ("model.adapter", "run.logs_dir"), "self-play": ("adapter", "out"), "cover": ("data", "out"),
               "eval": ("adapter", "out")}
# an eval setting: (the eval JSON's suffix, the config fields it sets); as the shell recipe named them
SETTINGS = {"greedy": ("greedy", {}), "sampled": ("t07", {"rollout.temperature": 0.7, "seed": 0}),
            "seeded": ("seeded", {"history": "seeded"}), "free": ("greedy_free", {"rollout.decode": "free"}),
            "words": ("greedy_words", {"rollout.decode": "words"})}
SHIP_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ship_adapter.py"   # this checkout's: runs
# recipe_ship.main on the ship stage's snapshot
# what the chain derives, which a recipe's stage config may not set
DERIVED = {"data": ("out", "progress"), "self-play": ("model", "dtype", "adapter", "out", "progress"),
           "cover": ("data", "out", "progress"), "eval": ("model", "dtype", "adapter", "games", "out", "progress"),
           **{kind: ("model.name", "model.dtype", "model.adapter", "data.folder", "run.name", "run.logs_dir",
                     "run.resume", "run.overwrite", "run.progress") for kind in ("sft", "grpo")}}
# fields whose being set changes what a stage does (`RolloutConfig.for_adapter`, `effective_mode`): a snapshot
# writes them only when the chain set them
AS_SET = ("decode", "rollout.decode", "rollout.prompt", "rollout.max_tokens_per_turn")
COMMANDS = {"data": ["data"], "sft": ["sft"], "grpo": ["train"], "self-play": ["data", "self-play"],
            "cover": ["data", "cover"], "eval": ["eval"]}


@dataclass
class Stage:
    name: str
    kind: str
    config: object | None = None          # the stage's config model (paths relative to the working folder)
    commands: list[list[str]] = field(default_factory=list)   # `wordle-mlx` words, one list per command
    script: list[str] | None = None       # a command that is not `wordle-mlx` (ship)
    run_dir: Path | None = None           # a training stage's run folder
    out: Path | None = None               # data folder, eval JSON or fused model
    units: int = 0                        # steps (training) or games (eval, self-play) for projected times

    @property
    def reads_snapshot(self) -> bool:
        """Its command reads its config from a snapshot file (`--config`)."""
        return self.kind in COMMANDS or self.kind == "ship"

    def snapshot_path(self, markers: Path) -> Path:
        return markers / "configs" / f"{self.name}.json"

    def command(self, markers: Path) -> list[str]:
        """The stage's `wordle-mlx` words; a config-file stage reads its snapshot."""
        if self.kind in COMMANDS:
            return [*COMMANDS[self.kind], "--config", str(self.snapshot_path(markers))]
        return self.commands[0] if self.commands else []


def snapshot(stage: Stage, markers: Path) -> dict:
    """The stage config as its snapshot file holds it: every field, but those of AS_SET only when the chain set
    them (unset, they stay unset for the child, as in a config file: an eval's decoding, prompt and reply length
    then come from the adapter it plays), paths relative to the snapshot's folder."""
    data = stage.config.model_dump(mode="json")
    for dotted in AS_SET:
        *parents, last = dotted.split(".")
        holder, model = data, stage.config
        for key in parents:
            holder, model = holder.get(key), getattr(model, key, None)
        if isinstance(holder, dict) and last in holder and last not in model.model_fields_set:
            del holder[last]
    folder = stage.snapshot_path(markers).parent
    for dotted in PATH_FIELDS.get(stage.kind, ()):
        node, *rest = dotted.split(".")
        holder, key = (data[node], rest[0]) if rest else (data, node)
        if holder.get(key) is not None:
            holder[key] = config_relative_path(holder[key], folder)
    return data


def write_snapshot(stage: Stage, markers: Path) -> Path:
    path = stage.snapshot_path(markers)
    if stage.kind == "ship":
        write_ship_config(stage.config, path)
    else:
        write_json_atomic(path, snapshot(stage, markers))
    return path


class ChainState:
    """What the chain has made so far, and the settings every stage reads."""

    def __init__(self, recipe: RecipeFile, settings: ModelSettings, games: int, progress: bool):
        self.recipe, self.settings, self.games, self.progress = recipe, settings, games, progress
        self.source = recipe._source or "recipe"
        self.trained: dict[str, Stage] = {}
        self.last_trained: Stage | None = None
        self.last_data: Path | None = None
        self.data_of: dict[str, Path] = {}
        self.last_self_play: Path | None = None
        self.fused: Stage | None = None
        self.fused_from: Stage | None = None      # the training stage whose adapter the fuse merged
        self.prompt: dict | None = None
        self.evals: dict[tuple[str, str], Path] = {}      # (player, setting) -> eval JSON

    def validate(self, step: Step, kind: str, data: dict):
        cfg = validate_config(data, CONFIG_MODELS[kind], f"{self.source}: stage {step.name}")
        cfg._base_dir = Path.cwd()
        return cfg

    def start(self, step: Step) -> Stage | None:
        """The training stage whose adapter `step` starts from (None: a fresh LoRA / the base model)."""
        start = getattr(step.entry, "start", None)
        if start == "previous":
            return self.last_trained
        if start is None:
            return None
        if start not in self.trained:
            raise UserError(f"{self.source}: stage {step.name}: start: no training stage {start!r} before it "
                            f"(got {start!r})")
        return self.trained[start]

    def adapters(self, stage: Stage | None, step: Step) -> str:
        if stage is None:
            raise UserError(f"{self.source}: stage {step.name}: no training stage before it to start from")
        return str(stage.run_dir / "adapters")

    def data_from(self, step: Step, default: Path | None, what: str) -> Path:
        name = getattr(step.entry, "data", None)
        if name is not None:
            if name not in self.data_of:
                raise UserError(f"{self.source}: stage {step.name}: data: no stage {name!r} before it makes data "
                                f"(got {name!r})")
            return self.data_of[name]
        if default is None:
            raise UserError(f"{self.source}: stage {step.name}: no {what} stage before it to read")
        return default

    def with_model(self, data: dict, name_field: str, dtype_field: str) -> dict:
        """`data` with the recipe's model, and the dtype when `--dtype` named one."""
        data = set_dotted_copy(data, name_field, self.settings.spec)
        return set_dotted_copy(data, dtype_field, self.settings.dtype_field) if self.settings.dtype_field else data

    def refuse_derived(self, step: Step) -> None:
        """A recipe does not set what the chain derives (paths, the model, the games): one line if it does."""
        for dotted in DERIVED.get(step.kind, ()):
            node, *rest = dotted.split(".")
            holder = step.config.get(node) if rest else step.config
            if isinstance(holder, dict) and (rest[0] if rest else node) in holder:
                value = holder[rest[0] if rest else node]
                raise UserError(f"{self.source}: stage {step.name}: config.{dotted}: derived from the stage names "
                                f"and the model (`wordle-mlx recipe --model`), not set in a recipe (got {value!r})")

    def progress_off(self, data: dict, dotted: str) -> dict:
        return data if self.progress else set_dotted_copy(data, dotted, False)


def build_data(state: ChainState, step: Step) -> Stage:
    out = state.settings.data_root / ("sft" + step.name.removeprefix("data"))
    cfg = state.validate(step, "data", state.progress_off(set_dotted_copy(step.config, "out", str(out)), "progress"))
    state.prompt = state.prompt or cfg.prompt.model_dump(mode="json")
    state.last_data = state.data_of[step.name] = out
    return Stage(step.name, "data", cfg, out=out)


def build_training(state: ChainState, step: Step) -> Stage:
    start = state.start(step)
    data = state.with_model(step.config, "model.name", "model.dtype")
    data = set_dotted_copy(data, "model.adapter", state.adapters(start, step) if start else None)
    data = set_dotted_copy(data, "run.logs_dir", "logs")
    data = set_dotted_copy(data, "run.name", state.settings.run_name(step.name))
    data = state.progress_off(data, "run.progress")
    if step.kind == "sft":
        data = set_dotted_copy(data, "data.folder", str(state.data_from(step, state.last_data, "data")))
        layers = state.settings.train_layers(state.recipe.share())
        if start is not None and layers is not None and "train_layers" not in data.get("lora", {}):
            data = set_dotted_copy(data, "lora.train_layers", layers)
    cfg = state.validate(step, step.kind, data)
    if step.kind == "grpo":                 # validated from step 0 (the start adapter), the best pass kept
        for key in ("every", "games"):
            if getattr(cfg.validation, key) == 0:
                raise UserError(f"{state.source}: stage {step.name}: config.validation.{key}: a recipe's GRPO stage "
                                "is validated from step 0 and keeps the adapter with the most wins (got 0)")
    if "grad_checkpoint" not in step.config.get("model", {}) and needs_checkpointing(step.kind, cfg, state.settings):
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"grad_checkpoint": True})})
    stage = Stage(step.name, step.kind, cfg, run_dir=Path("logs") / cfg.run.name, units=cfg.run.steps)
    state.trained[step.name] = state.last_trained = stage
    return stage


def build_self_play(state: ChainState, step: Step) -> Stage:
    start = state.start(step)
    out = state.settings.data_root / step.name
    data = state.with_model(step.config, "model", "dtype")
    data = set_dotted_copy(data, "adapter", state.adapters(start, step) if start else None)
    cfg = state.validate(step, "self-play", state.progress_off(set_dotted_copy(data, "out", str(out)), "progress"))
    state.last_data = state.last_self_play = state.data_of[step.name] = out
    return Stage(step.name, "self-play", cfg, out=out)


def build_cover(state: ChainState, step: Step) -> Stage:
    source = state.data_from(step, state.last_self_play, "self-play")
    data = state.progress_off(set_dotted_copy(step.config, "data", str(source)), "progress")
    cfg = state.validate(step, "cover", set_dotted_copy(data, "out", "-"))
    out = Path(f"{source}-cover{cfg.max_candidates or 'all'}c{cfg.copies}")
    cfg = cfg.model_copy(update={"out": str(out)})
    state.last_data = state.data_of[step.name] = out
    return Stage(step.name, "cover", cfg, out=out)


def build_eval(state: ChainState, step: Step) -> Stage:
    settings, player = state.settings, step.player
    setting = "greedy" if step.guard else step.entry.setting
    data = state.with_model(step.config, "model", "dtype")
    data.update(games=state.games, baselines=False)
    suffix, fields = SETTINGS[setting]
    if player == "shipped":                 # the guard's eval of the adapter in the tree, as the new one played
        data.update(adapter=str(settings.ship_dir))
        if step.guard == "seeded":            # seeded boards in the decoding the new adapter records
            new = state.start(step)
            suffix, fields = "seeded", {"history": "seeded", "rollout.decode": new.config.decode if new else None}
        else:
            suffix, fields = f"greedy_{step.guard}", {"rollout.decode": step.guard}
    else:
        target = state.recipe.players[player]
        if target is None:                                # the base model plays the chain's prompt
            data = set_dotted_copy(data, "rollout.prompt", state.prompt)
            data["baselines"] = True
        elif state.fused is not None and target == state.fused.name:
            data = set_dotted_copy(data, "rollout.prompt", state.prompt)
            data = set_dotted_copy(data, "rollout.decode", state.fused_from.config.decode)
            data["model"] = str(state.fused.out)
        elif target in state.trained:
            data["adapter"] = str(state.trained[target].run_dir / "adapters")
        else:
            raise UserError(f"{state.source}: players.{player}: no training or fuse stage {target!r} before stage "
                            f"{step.name} (got {target!r})")
    for dotted, value in fields.items():
        data = set_dotted_copy(data, dotted, value)
    out = settings.markers / f"eval_{player}_{suffix}.json"
    cfg = state.validate(step, "eval", state.progress_off(set_dotted_copy(data, "out", str(out)), "progress"))
    state.evals[(player, f"shipped-{step.guard}" if step.guard else setting)] = out
    return Stage(step.name, "eval", cfg, out=out, units=cfg.games)


def build_fuse(state: ChainState, step: Step) -> Stage:
    start = state.start(step)
    out = state.settings.markers / "fused"
    cfg = validate_config({"model": state.settings.spec, "adapter": state.adapters(start, step), "out": str(out),
                           "dtype": state.settings.dtype_field, "dequantize": state.settings.bits is not None,
                           "overwrite": True, **step.config}, FuseConfig, f"{state.source}: stage {step.name}")
    words = ["fuse", "--model", cfg.model, "--adapter", cfg.adapter, "--out", cfg.out, "--overwrite"]
    words += (["--dequantize"] if cfg.dequantize else []) + (["--dtype", cfg.dtype] if cfg.dtype else [])
    state.fused, state.fused_from = Stage(step.name, "fuse", cfg, [words], out=out), start
    return state.fused


def build_plots(state: ChainState, step: Step) -> Stage:
    markers, commands = state.settings.markers, []
    for folder, run in step.entry.runs.items():
        if run not in state.trained:
            raise UserError(f"{state.source}: stage {step.name}: runs.{folder}: no training stage {run!r} before it "
                            f"(got {run!r})")
        commands.append(["plot", "--file", str(state.trained[run].run_dir / "metrics.jsonl"),
                         "--out", str(markers / "plots" / folder)])
    if step.entry.compare:
        players = [p for (p, s) in state.evals if s == step.entry.compare]
        commands.append(["plot", "--compare", *[str(state.evals[(p, step.entry.compare)]) for p in players],
                         "--labels", *players, "--with-baselines", "--out", str(markers / "plots" / "compare")])
    return Stage(step.name, "plots", None, commands)


def build_ship(state: ChainState, step: Step, stages: list[Stage], ship_exists: bool) -> Stage:
    """The ship stage: the guard's pairs of evals (only when an adapter is in the ship folder) and the package's
    inputs (`recipe_ship.ShipConfig`), run by scripts/ship_adapter.py on its snapshot."""
    start, settings = state.start(step), state.settings
    adapter = state.adapters(start, step)
    label = next((p for p, s in state.recipe.players.items() if s == start.name), None)
    guard = []
    if ship_exists and step.entry.guard:
        primary = start.config.decode
        if primary not in step.entry.guard:
            raise UserError(f"{state.source}: stage {step.name}: guard: must include the decoding the adapter it "
                            f"ships records ({primary}), the guard's first comparison (got {step.entry.guard!r})")
        for mode in step.entry.guard:
            setting = "greedy" if mode == primary else mode
            new = state.evals.get((label, setting))
            if new is None:
                raise UserError(f"{state.source}: stage {step.name}: guard {mode}: no {setting} eval of the adapter "
                                f"it ships (player {label}) before it (got {mode!r})")
            guard.append({"setting": mode, "primary": mode == primary, "new": str(new),
                          "shipped": str(state.evals[("shipped", f"shipped-{mode}")])})
        guard.sort(key=lambda pair: not pair["primary"])
    cfg = validate_config({"model": settings.spec, "adapter": adapter, "out": str(settings.ship_dir),
                           "recipe": state.source, "markers": str(settings.markers),
                           "stages": {s.name: s.kind for s in stages}, "evals": [str(p) for p in state.evals.values()],
                           "guard": guard}, ShipConfig, f"{state.source}: stage {step.name}")
    cfg._base_dir = Path.cwd()
    stage = Stage(step.name, "ship", cfg)
    stage.script = [sys.executable, display_path(SHIP_SCRIPT), "--config", str(stage.snapshot_path(settings.markers))]
    return stage


def build_chain(recipe: RecipeFile, steps: list[Step], settings: ModelSettings, games: int = 200,
                progress: bool = True, ship_exists: bool = False) -> list[Stage]:
    """The stages of `steps` for the model of `settings`; the shipped adapter's evals only when `ship_exists`
    (an adapter already in the ship folder, which the guard compares with)."""
    state, stages = ChainState(recipe, settings, games, progress), []
    for step in steps:
        if step.guard and not ship_exists:
            continue
        state.refuse_derived(step)
        if step.kind == "model":
            if not settings.spec.startswith("builtin:"):
                continue                       # a Hub model is downloaded by the first stage that loads it
            stage = Stage(step.name, "model", None, [["model", "import", settings.spec]])
        elif step.kind == "entropy":
            cfg = state.validate(step, "entropy", step.config)
            words = ["entropy"] + [w for k, v in step.config.items() for w in (f"--{k.replace('_', '-')}", str(v))]
            stage = Stage(step.name, "entropy", cfg, [words])
        elif step.kind in ("sft", "grpo"):
            stage = build_training(state, step)
        elif step.kind == "ship":
            stage = build_ship(state, step, stages, ship_exists)
        else:
            stage = {"data": build_data, "self-play": build_self_play, "cover": build_cover, "eval": build_eval,
                     "fuse": build_fuse, "plots": build_plots}[step.kind](state, step)
        stages.append(stage)
    return stages

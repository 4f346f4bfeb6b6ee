"""`wordle-mlx recipe`: run a recipe file's chain of stages for one model, resumably.

It reads the recipe (`recipe_file.py`: config/recipe.json by default), derives the model's settings
(`recipe_model.py`: names, dtype, the blocks SFT trains, gradient checkpointing, the fuse), builds every stage's
config and command (`recipe_build.py`), and runs the stages in order, each as its own `wordle-mlx` process
reading a snapshot of its config (`logs/recipe-<tag>/configs/<stage>.json`; `recipe_run.py`). A finished stage
leaves `<stage>.done` with its seconds and is skipped the next time; an interrupted training stage resumes from
its checkpoint; a failed or stopped stage ends the run with that stage's exit status, the stages before it done.
`--until STAGE` stops after that stage; `--dry-run` prints the stages still to run, their commands, planned peaks
and projected times instead (`recipe_plan.py`). When a stage ends it prints one line with its seconds and result.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from ..config import StrictModel
from ..errors import UserError
from .recipe_build import Stage, build_chain, write_snapshot
from .recipe_file import expand, load_recipe
from .recipe_model import DEFAULT_MODEL, ModelSettings, model_settings
from .recipe_plan import dry_run
from .recipe_run import is_done, record_end, record_rate, run_child, stage_argv, stage_result


DEFAULT_RECIPE = "config/recipe.json"


class RecipeConfig(StrictModel):
    recipe: str = Field(DEFAULT_RECIPE, description="The recipe file.")
    model: str = Field(DEFAULT_MODEL, description="The model the recipe trains; its settings derive from it.")
    dry_run: bool = Field(False, description="Print the stages still to run and their plans; run nothing.")
    until: str | None = Field(None, description="Stop after this stage.")
    games: int = Field(200, ge=1, description="Games of every eval.")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="The dtype every stage computes in (default: this machine's: float32 on CPU, bfloat16 on "
        "a GPU).")
    memory_gb: float | None = Field(None, gt=0, description="Plan for a Mac of this much memory (default: this "
                                    "machine's).")
    progress: bool = Field(True, description="Progress bars in every stage.")


def say(text: str) -> None:
    print(text, flush=True)          # one line each, never wrapped (the stages' own output goes between)


def build_stages(recipe_path: str = DEFAULT_RECIPE, model: str = DEFAULT_MODEL, dtype: str | None = None,
                 memory_gb: float | None = None, games: int = 200, progress: bool = True,
                 ship_exists: bool | None = None) -> tuple[ModelSettings, list[Stage]]:
    """The model's settings and every stage of the recipe for it, configs built (paths relative to the working
    folder); `ship_exists` None: whether an adapter is in the model's ship folder (the guard's evals)."""
    recipe = load_recipe(recipe_path)
    settings = model_settings(model, dtype, memory_gb)
    if ship_exists is None:
        ship_exists = (settings.ship_dir / "adapters.safetensors").is_file()
    return settings, build_chain(recipe, expand(recipe, settings.size), settings, games, progress, ship_exists)


def run(cfg: RecipeConfig) -> dict:
    settings, stages = build_stages(cfg.recipe, cfg.model, cfg.dtype, cfg.memory_gb, cfg.games, cfg.progress)
    names = [s.name for s in stages]
    if cfg.until is not None:
        if cfg.until not in names:
            raise UserError(f"--until {cfg.until}: not a stage of {cfg.recipe} for {cfg.model} "
                            f"(stages: {', '.join(names)})")
        stages = stages[: names.index(cfg.until) + 1]
    if cfg.dry_run:
        return {"dry_run": True, **dry_run(stages, settings, cfg.memory_gb)}

    markers, start = settings.markers, time.time()
    markers.mkdir(parents=True, exist_ok=True)
    ran = []
    for stage in stages:
        if is_done(markers, stage.name):
            say(f"== {stage.name}: done earlier, skipped")
            continue
        say(f"\n== [{time.time() - start:.0f}s] {stage.name}")
        if stage.reads_snapshot:
            write_snapshot(stage, markers)
        t0, status = time.time(), 0
        for argv in stage_argv(stage, markers):
            status = run_child(argv)
            if status != 0:
                break
        seconds = record_end(markers, stage.name, time.time() - t0, status == 0)
        if status != 0:
            say(f"recipe stopped in stage {stage.name} (status {status}, {seconds}s so far); run it again to go on")
            return {"status": status, "stopped_in": stage.name, "ran": ran}
        record_rate(settings.spec, settings.dtype, stage, seconds)
        result = stage_result(stage)
        say(f"== {stage.name}: {seconds}s" + (f", {result}" if result else ""))
        ran.append(stage.name)
    ended = f"stopped after {cfg.until} (--until; run again without it to go on)" if cfg.until else "done"
    say(f"\nrecipe {ended} for {settings.spec}: this run took {time.time() - start:.0f}s "
        f"(stage seconds: {markers}/*.done)")
    return {"status": 0, "ran": ran, "markers": str(markers)}

"""What a recipe derives from the model it trains: its names and folders, its size, the dtype, the blocks SFT
trains, whether a training step needs gradient checkpointing, and the fuse's dequantization.

`model_settings(spec, dtype, memory_gb)` reads the model's config.json as the planner does (a builtin model, a
folder, the Hugging Face cache, or the known dimensions of the Gemma 3 checkpoints before any download:
`planning/stage_plan.model_config_dict`), so nothing needs the weights on disk. The dtype is the one the run
uses on this machine (`runtime/device.default_dtype`: float32 on CPU, bfloat16 on a GPU) unless `--dtype` names
one; only a named one is written into the stage configs (None already means the machine's own). The memory budget
is `--memory-gb` as a Mac's working set (`planning/memory.working_set`), else this machine's. `train_layers` is the
recipe's share of the blocks, rounded up (a third: 6 of 18, 12 of 34). `needs_checkpointing(kind, cfg, settings)`
plans a training step without gradient checkpointing, with examples of max_seq_length tokens (the plan before the
data exists, so the choice does not change once it does) and says whether it exceeds the budget. Names: the
model's tag (`270m`, `4b-bf16`, `4b-4bit`) makes the run names (`<stage>-<tag>`), the marker folder
(`logs/recipe-<tag>`) and the data folder (`data/<tag>/`; the default model's data stays in `data/`, where
the earlier shell recipe put it), and the ship folder is `adapters/<model name>-wordle`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from ..llm.model.models import is_current_build
from ..planning import memory as mp
from ..planning.gemma3_sizes import REPO, known_config
from ..planning.stage_plan import model_config_dict, model_dims, plan_for, stage_parts, this_machine_working_set
from ..runtime import device
from ..storage.fileio import cache_dir

DEFAULT_MODEL = "builtin:gemma-3-270m"
NO_DATA = "/nonexistent/wordle-mlx-recipe-plan"   # a data folder that is never there: the plan before the data


@dataclass(frozen=True)
class ModelSettings:
    spec: str
    tag: str                 # run names, marker and data folders
    size: str                # what a recipe stage's `models` names
    layers: int
    bits: int | None         # quantized weights
    dtype: str               # the dtype the run computes in
    dtype_field: str | None  # what the stage configs say (None: the machine's default)
    budget_gb: float
    budget_note: str
    config: dict             # the model's config.json, or its known sizes before any download

    @property
    def markers(self) -> Path:
        return Path("logs") / f"recipe-{self.tag}"

    @property
    def data_root(self) -> Path:
        return Path("data") if self.spec == DEFAULT_MODEL else Path("data") / self.tag

    @property
    def ship_dir(self) -> Path:
        return Path("adapters") / f"{self.spec.removeprefix('builtin:').rstrip('/').split('/')[-1]}-wordle"

    def run_name(self, stage: str) -> str:
        return f"{stage}-{self.tag}"

    def train_layers(self, share: Fraction | None) -> int | None:
        return None if share is None else math.ceil(self.layers * share)


def model_tag(spec: str) -> tuple[str, str]:
    """(tag, size): `builtin:gemma-3-270m` -> (270m, 270m); `mlx-community/gemma-3-4b-it-4bit` -> (4b-4bit, 4b);
    any other name -> its last part, made safe for a folder name."""
    name = spec.removeprefix("builtin:")
    match = REPO.match(name) or REPO.match(f"x/{name}")
    if match:
        size = match["size"].lower()
        return (f"{size}-{match['precision'].lower()}" if match["precision"] else size), size
    slug = re.sub(r"[^A-Za-z0-9.-]+", "-", name.rstrip("/").split("/")[-1]).strip("-").lower() or "model"
    return slug, slug


def model_config(spec: str) -> dict:
    """The model's config.json as the planner reads it; the builtin 270M's known sizes until it is built (the
    planner would build it)."""
    if spec == DEFAULT_MODEL and not is_current_build(cache_dir("models") / f"gemma-3-270m-{device.default_dtype()}"):
        return known_config("google/gemma-3-270m")
    return model_config_dict(spec, None)


def model_settings(spec: str, dtype: str | None = None, memory_gb: float | None = None) -> ModelSettings:
    config = model_config(spec)
    dims = model_dims(config, dtype, f"model {spec!r} config.json", device.default_dtype() != "float32")
    tag, size = model_tag(spec)
    if memory_gb:
        budget, note = mp.working_set(memory_gb), mp.working_set_note(memory_gb)
    else:
        budget, note = this_machine_working_set()
    return ModelSettings(spec=spec, tag=tag, size=size, layers=dims.layers, bits=dims.bits,
                         dtype=dtype or device.default_dtype(), dtype_field=dtype, budget_gb=mp.gb(budget),
                         budget_note=note, config=config)


def dense_config(config: dict) -> dict:
    """A model config.json without quantization (a fused model written dequantized)."""
    return {k: v for k, v in config.items() if k != "quantization"}


def planned_peak_gb(kind: str, cfg, settings: ModelSettings, config: dict | None = None) -> float:
    """The planned peak (GiB) of one step of an SFT, GRPO, eval or self-play config, as `wordle-mlx plan`
    reports it, from `config` (default: the settings' model config; no download, no build)."""
    spec, dtype, numbers_of, _ = stage_parts(kind, cfg)
    config = config or (settings.config if spec == settings.spec else model_config(spec))
    dims = model_dims(config, dtype, f"model {spec!r} config.json", device.default_dtype() != "float32")
    numbers, _ = numbers_of(cfg, None)
    return mp.gb(plan_for(kind, dims, numbers).peak)


def needs_checkpointing(kind: str, cfg, settings: ModelSettings) -> bool:
    """Whether one step of the SFT or GRPO config `cfg` (without checkpointing) exceeds the memory budget."""
    update = {"model": cfg.model.model_copy(update={"grad_checkpoint": False})}
    if kind == "sft":
        update["data"] = cfg.data.model_copy(update={"folder": NO_DATA})
    return planned_peak_gb(kind, cfg.model_copy(update=update), settings) > settings.budget_gb

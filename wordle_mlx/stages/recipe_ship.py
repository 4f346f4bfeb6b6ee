"""The recipe's ship stage: the guard (`recipe_guard.py`), then the package of what the recipe trained.

The runner builds a `ShipConfig` (`recipe_build.build_ship`) and writes it, like every stage's config, to
`logs/recipe-<tag>/configs/ship.json` (paths relative to that folder); `scripts/ship_adapter.py --config FILE`
runs `main` on it in its own process. When an adapter is already in `out`, each guard setting's pair of eval JSONs
is compared (one line each) and a failed guard leaves `out` as it was (exit 0: nothing failed, nothing shipped).
Otherwise the package is written to a temp folder beside `out` and renamed into place. It holds:

- `adapters.safetensors`, `adapter_config.json` (at most 20 MB);
- `recipe.json`: the recipe file; `recipe/<stage>.json`: every stage's config snapshot as it ran (paths relative
  to the run's `configs/` folder), `ship.json` included;
- `stage_seconds.json`: `{stage: seconds}` of every stage from the base model on, in the order they ran (each
  stage's `<stage>.done`; a stage without one is an error: the package would not say what the adapter cost);
- the run's eval JSONs (the guard's evals of the adapter it replaces included), and a README with their table
  and the guard's lines;
- `data_seed.json`: the data and self-play configs and every train and valid secret they used (a self-play
  folder that is gone: the secrets its seed plays), so a test can check no test word was ever a secret.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from pydantic import Field

from ..config import StrictModel, config_relative_path, display_path, load_config, resolve_path
from ..errors import UserError
from ..storage.fileio import publish_dir, write_text_atomic
from .recipe_guard import NotComparable, compare, eval_decode, verdict

ADAPTER_FILES = ("adapters.safetensors", "adapter_config.json")
MAX_BYTES = 20 * 1024 * 1024
SECRET_KINDS = ("data", "self-play")     # stages whose data folders' secrets data_seed.json lists
README = """# {out}

LoRA adapter (mlx-lm format) for `{model}`,
packaged from `{adapter}`
by the ship stage of `wordle-mlx recipe` (`make train-270m` for the 270M). `recipe.json` is the recipe file that
trained it; `recipe/` holds every stage's config as it ran, and `stage_seconds.json` every stage's seconds from
the base model on, in the order they ran ({total_h:.2f} h in all). Its `adapter_config.json` records the prompt
settings it was trained with (`wordle_prompt`) and the decoding it was trained for (`decode`, `trained_free`),
which `eval`, `play` and `train` use for it.

    wordle-mlx play --adapter {out}
    wordle-mlx eval --adapter {out} --games 200 --max-tokens {max_tokens} --no-baselines

- `data_seed.json`: the data and self-play configs and every train/valid secret; `tests/test_shipped_adapter.py`
  checks that none is a test word.
- The ship guard: {guard}

| eval JSON | split | history | temperature | decoding | wins | win rate (95% CI) | format-valid replies | invalid words |
|---|---|---|---:|---|---:|---:|---:|---:|
{evals}
"""


class GuardPair(StrictModel):
    setting: str = Field(description="words, free or grammar (greedy empty boards), or seeded (seeded boards).")
    primary: bool = Field(description="The decoding the adapter records: at least as many wins, else not "
                          "significantly worse.")
    new: str = Field(description="The new adapter's eval JSON.")
    shipped: str = Field(description="The same eval of the adapter in `out`.")


class ShipConfig(StrictModel):
    model: str = Field(description="The base model the adapter is for.")
    adapter: str = Field(description="The adapter folder to ship.")
    out: str = Field(description="The package folder (the adapter in the tree, which the guard compares with).")
    recipe: str = Field(description="The recipe file.")
    markers: str = Field(description="The run's marker folder: <stage>.done, configs/<stage>.json.")
    stages: dict[str, str] = Field(description="Every stage before ship, in the order they ran -> its kind.")
    evals: list[str] = Field([], description="The run's eval JSONs.")
    guard: list[GuardPair] = Field([], description="One pair per setting; empty: nothing shipped yet.")

    def dump_relative(self, folder: Path) -> dict:
        """The config as its snapshot in `folder` stores it: every path relative to that folder."""
        rel = lambda p: config_relative_path(p, folder)   # noqa: E731
        data = self.model_dump(mode="json")
        for key in ("adapter", "out", "recipe", "markers"):
            data[key] = rel(data[key])
        data["evals"] = [rel(p) for p in data["evals"]]
        for pair in data["guard"]:
            pair["new"], pair["shipped"] = rel(pair["new"]), rel(pair["shipped"])
        return data


def stage_seconds(cfg: ShipConfig) -> dict[str, int]:
    """{stage: seconds} of every stage before ship, in the order they ran (each stage's `<stage>.done`)."""
    markers, out = resolve_path(cfg, cfg.markers).resolve(), {}
    for name in cfg.stages:
        path = Path(display_path(markers / f"{name}.done"))
        try:
            text = path.read_text().strip()
        except OSError:
            raise UserError(f"{path}: missing: stage {name} has not finished, and the package records every "
                            "stage's seconds (run the recipe to its ship stage)") from None
        if not text.isdigit():
            raise UserError(f"{path}: expected the stage's seconds, got {text[:40]!r}")
        out[name] = int(text)
    return out


def snapshot_files(cfg: ShipConfig) -> list[Path]:
    folder = resolve_path(cfg, cfg.markers) / "configs"
    return [folder / f"{name}.json" for name in [*cfg.stages, "ship"] if (folder / f"{name}.json").is_file()]


def folder_secrets(folder: Path) -> dict[str, list[str]] | None:
    """The secrets of a data folder's train and valid records (None: the folder is gone)."""
    out = {}
    for split in ("train", "valid"):
        path = folder / f"{split}.jsonl"
        if not path.is_file():
            return None
        out[split] = sorted({json.loads(line)["meta"]["secret"] for line in path.read_text().splitlines() if line})
    return out


def data_seed(cfg: ShipConfig) -> dict:
    from .choice_config import ChoiceConfig
    from .data import DataConfig

    folder = resolve_path(cfg, cfg.markers) / "configs"
    seed = {"data_configs": [], "choice_configs": [], "secrets": {"train": set(), "valid": set()},
            "note": "GRPO draws its secrets from the train split (wordle_mlx/game/splits.py) with its own seed."}
    for name, kind in cfg.stages.items():
        if kind not in SECRET_KINDS:
            continue
        path = folder / f"{name}.json"
        stage_cfg = load_config(path, DataConfig if kind == "data" else ChoiceConfig)
        seed["data_configs" if kind == "data" else "choice_configs"].append(json.loads(path.read_text()))
        data_dir = resolve_path(stage_cfg, stage_cfg.out).resolve()
        secrets = folder_secrets(data_dir)
        if secrets is None and kind == "data":
            raise UserError(f"{display_path(data_dir)}: missing train.jsonl or valid.jsonl (the data of stage "
                            f"{name}); the package lists every secret the adapter trained on")
        if secrets is None:                         # a self-play round whose folder is gone: its seed's secrets
            from ..game.splits import split_answers
            from .choice import played_secrets
            print(f"note: {display_path(data_dir)}: not here; the secrets its round played are taken from "
                  f"{display_path(path)}'s seed", file=sys.stderr)
            secrets = played_secrets(stage_cfg, split_answers())
        for split, words in secrets.items():
            seed["secrets"][split].update(words)
    seed["secrets"] = {k: sorted(v) for k, v in seed["secrets"].items()}
    return seed


def eval_row(path: Path, e: dict) -> str:
    lo, hi = e["win_rate_ci95"]
    return (f"| `{path.name}` | {e['split']} | {e['history']} | {e['temperature']} | {eval_decode(e)} "
            f"| {e['wins']} / {e['games']} | {100 * e['win_rate']:.1f}% ({100 * lo:.1f}-{100 * hi:.1f}) "
            f"| {100 * (1 - e['format_error_rate']):.1f}% | {100 * e['invalid_rate']:.1f}% |")


def guard_lines(cfg: ShipConfig) -> tuple[list[str], str | None]:
    """The guard's one line per setting, and why not to ship (None: ship)."""
    if not (resolve_path(cfg, cfg.out) / "adapters.safetensors").is_file() or not cfg.guard:
        return [], None
    comparisons, lines = [], []
    for pair in cfg.guard:
        try:
            c = compare(pair.setting, pair.primary, resolve_path(cfg, pair.new), resolve_path(cfg, pair.shipped))
        except NotComparable as err:
            lines.append(f"guard {pair.setting}: cannot compare: {err}")
            return lines, f"the guard's {pair.setting} evals cannot be compared ({err})"
        comparisons.append(c)
        lines.append(c.line())
    return lines, verdict(comparisons)


def ship(cfg: ShipConfig) -> dict:
    adapter, out = resolve_path(cfg, cfg.adapter).resolve(), resolve_path(cfg, cfg.out).resolve()
    lines, why = guard_lines(cfg)
    for line in lines:
        print(line, flush=True)
    if why is not None:
        print(f"not shipped: {why}; {display_path(out)} left as it was", flush=True)
        return {"shipped": False, "reason": why, "guard": lines}
    for name in ADAPTER_FILES:
        if not (adapter / name).is_file():
            raise UserError(f"{adapter / name}: missing; the ship stage's adapter must be an mlx-lm adapter folder")
    size = (adapter / "adapters.safetensors").stat().st_size
    if size > MAX_BYTES:
        raise UserError(f"{adapter}/adapters.safetensors: {size} bytes, over the 20 MB limit")
    seconds, snapshots, seed = stage_seconds(cfg), snapshot_files(cfg), data_seed(cfg)
    evals = [resolve_path(cfg, p) for p in cfg.evals]
    for path in evals:
        if not path.is_file():
            raise UserError(f"{path}: missing (an eval of this run, which the package ships)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)
    try:
        for name in ADAPTER_FILES:
            shutil.copy2(adapter / name, tmp / name)
        shutil.copy2(resolve_path(cfg, cfg.recipe), tmp / "recipe.json")
        (tmp / "recipe").mkdir()
        for path in snapshots:
            shutil.copy2(path, tmp / "recipe" / path.name)
        (tmp / "stage_seconds.json").write_text(json.dumps(seconds, indent=1) + "\n")
        (tmp / "data_seed.json").write_text(json.dumps(seed, indent=1) + "\n")
        rows, max_tokens = [], 16
        for path in evals:
            shutil.copy2(path, tmp / path.name)
            e = json.loads(path.read_text())
            max_tokens = e.get("max_tokens_per_turn", max_tokens)
            rows.append(eval_row(path, e))
        guard = ("against the adapter it replaced, on the same games (its evals: the `eval_shipped_*.json` below, made "
                 "while it was the shipped one):\n" + "\n".join(f"  - {line}" for line in lines)
                 if lines else "nothing was shipped before it.")
        (tmp / "README.md").write_text(README.format(
            out=display_path(out), model=cfg.model, adapter=display_path(adapter), total_h=sum(seconds.values()) / 3600,
            max_tokens=max_tokens, guard=guard, evals="\n".join(rows)))
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"shipped {display_path(adapter)} -> {display_path(out)} ({size / 1e6:.1f} MB adapter, {len(snapshots)} "
          f"stage configs, {len(evals)} evals, {sum(seconds.values())} s over {len(seconds)} stages)", flush=True)
    return {"shipped": True, "guard": lines, "stage_seconds": seconds}


def write_config(cfg: ShipConfig, path: Path) -> None:
    write_text_atomic(path, json.dumps(cfg.dump_relative(path.parent), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Ship a recipe's adapter: the guard, then the package "
                                 "(wordle_mlx/stages/recipe_ship.py).")
    ap.add_argument("--config", required=True, type=Path,
                    help="The ship stage's config, as the recipe writes it: logs/recipe-<tag>/configs/ship.json.")
    args = ap.parse_args(argv)
    try:
        ship(load_config(args.config, ShipConfig))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0

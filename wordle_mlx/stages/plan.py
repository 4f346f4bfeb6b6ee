"""`wordle-mlx plan`: the expected peak memory of a stage before it runs, and which Macs it fits.

Reads the stage config (SFT, GRPO, eval or self-play, told apart by loading it with each stage's strict
loader: the config classes of the `*_config` modules), and hands it to the planner (`planning/stage_plan.py`):
the model's `config.json` or the known dimensions of the Gemma 3 checkpoints users name, the numbers of
`planning/memory.py` in the decoding mode the config uses, the itemised peak with its arithmetic, the Mac memory
sizes whose working set (two thirds of memory up to 32 GB, three quarters above) holds it, and the largest batch
that fits `--memory-gb` (default: this machine's working set: Metal's recommended size on a Mac). With `--measure`, `plan_measure.run` adds two real steps of the stage. A `fuse` or `export` config
(or command: `wordle-mlx plan fuse --adapter A --out D ...`) is planned by `planning/fuse_plan.py`: the peak of
fusing layer by layer, or of writing the GGUF tensor by tensor, and the Macs it fits.
"""

from __future__ import annotations

from ..config import StrictModel, load_config
from ..errors import UserError
from ..planning import memory as mp
from ..planning.fuse_plan import fuse_report
from ..planning.stage_plan import plan_report
from .choice_config import ChoiceConfig
from .eval_config import EvalConfig
from .export_config import ExportConfig
from .fuse_config import FuseConfig
from .grpo_config import GRPOConfig
from .sft_config import SFTConfig


class PlanConfig(StrictModel):
    config: str
    model_json: str | None = None
    memory_gb: float | None = None
    prompt_tokens: int | None = None
    measure: bool = False          # plan_measure.run: also two real steps of the stage
    json_output: bool = False


def stage_config(path: str):
    """(("sft" | "grpo" | "eval" | "self-play" | "fuse" | "export"), config): whichever strict loader accepts the
    file first; else one line naming each loader's error. Fuse and export come last: a file the self-play or eval
    loader also accepts (only model, adapter, dtype and out) is planned as those; plan the command instead."""

    errors = []
    for kind, model in (("sft", SFTConfig), ("grpo", GRPOConfig), ("self-play", ChoiceConfig), ("eval", EvalConfig),
                        ("fuse", FuseConfig), ("export", ExportConfig)):
        try:
            return kind, load_config(path, model)
        except UserError as e:
            if "file not found" in str(e) or "invalid JSON" in str(e) or "is a folder" in str(e):
                raise
            errors.append(f"as {kind}: {str(e).removeprefix(str(path) + ': ')}")
    raise UserError(f"{path}: not an SFT, GRPO, self-play, eval, fuse or export config ({'; '.join(errors)})")


def run(cfg: PlanConfig, stage: tuple | None = None) -> dict:
    """The plan of the config file `cfg.config`, or of `stage` ((kind, loaded config): a fuse or export command,
    whose words `cfg.config` then holds)."""
    kind, stage_cfg = stage or stage_config(cfg.config)
    if kind in ("fuse", "export"):
        result = {"config": cfg.config, **fuse_report(kind, stage_cfg, cfg.model_json, cfg.memory_gb)}
        if not cfg.json_output:
            print_fuse_plan(result)
        return result
    result = {"config": cfg.config,
              **plan_report(kind, stage_cfg, cfg.model_json, cfg.prompt_tokens, cfg.memory_gb)}
    if not cfg.json_output:
        print_plan(result)
    return result


def print_fuse_plan(r: dict) -> None:
    width = f"{r['bits']}-bit" if r["bits"] else {4: "float32", 2: "16-bit"}[r["value_bytes"]]
    print(f"{r['config']}: {r['stage']} of {r['model']} ({width}, {r['value_bytes']}-byte values); {r['inputs']}")
    for name, value in r["items_gb"].items():
        print(f"  {name:<12}{value:8.2f} GB  {r['notes'].get(name, '')}")
    print(f"  {'peak':<12}{r['peak_gb']:8.2f} GB  {r['notes'].get('phase', '')}".rstrip())
    fits = ", ".join(str(s) for s in r["fits_mac_gb"]) or "none of " + ", ".join(str(s) for s in mp.MAC_SIZES_GB)
    print(f"fits Macs of {fits} GB ({mp.WORKING_SET_RULE}); "
          f"{'within' if r['fits_budget'] else 'over'} {r['budget_gb']:.1f} GB ({r['budget']})")


def print_plan(r: dict) -> None:
    width = "4-bit" if r["bits"] == 4 else f"{r['bits']}-bit" if r["bits"] else {4: "float32", 2: "16-bit"}[r["value_bytes"]]
    print(f"{r['config']}: one {r['stage'].upper()} step of {r['model']} ({width}, {r['value_bytes']}-byte values); "
          f"{r['inputs']}")
    for name, value in r["items_gb"].items():
        print(f"  {name:<12}{value:8.2f} GB  {r['notes'].get(name, '')}")
    print(f"  {'peak':<12}{r['peak_gb']:8.2f} GB  {r['notes'].get('phase', '')}".rstrip())
    fits = ", ".join(str(s) for s in r["fits_mac_gb"]) or "none of " + ", ".join(str(s) for s in mp.MAC_SIZES_GB)
    print(f"fits Macs of {fits} GB ({mp.WORKING_SET_RULE})")
    how = " (its B x (G + 1) replies decoded in one batch)" if r["stage"] == "grpo" else ""
    print(f"largest {r['batch_field']}{how} within {r['budget_gb']:.1f} GB ({r['budget']}): {r['largest_batch']}")

"""`wordle-mlx plan`: the expected peak memory of a stage before it runs, and which Macs it fits.

Reads the stage config (SFT, GRPO, eval or self-play, told apart by loading it with each stage's strict
loader: the config classes of the `*_config` modules), and hands it to the planner (`planning/stage_plan.py`):
the model's `config.json` or the known dimensions of the Gemma 3 checkpoints users name, the numbers of
`planning/memory.py` in the decoding mode the config uses, the itemised peak with its arithmetic, the Mac memory
sizes whose ~75% working set holds it, and the largest batch that fits `--memory-gb` (default: this machine's
working set). With `--measure`, `plan_measure.run` adds two real steps of the stage.
"""

from __future__ import annotations

from ..config import StrictModel, load_config
from ..errors import UserError
from ..planning import memory as mp
from ..planning.stage_plan import plan_report
from .choice_config import ChoiceConfig
from .eval_config import EvalConfig
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
    """(("sft" | "grpo" | "eval" | "self-play"), config): whichever strict loader accepts the file; else one line
    naming each loader's error."""

    errors = []
    for kind, model in (("sft", SFTConfig), ("grpo", GRPOConfig), ("self-play", ChoiceConfig), ("eval", EvalConfig)):
        try:
            return kind, load_config(path, model)
        except UserError as e:
            if "file not found" in str(e) or "invalid JSON" in str(e) or "is a folder" in str(e):
                raise
            errors.append(f"as {kind}: {str(e).removeprefix(str(path) + ': ')}")
    raise UserError(f"{path}: not an SFT, GRPO, self-play or eval config ({'; '.join(errors)})")


def run(cfg: PlanConfig) -> dict:
    kind, stage_cfg = stage_config(cfg.config)
    result = {"config": cfg.config,
              **plan_report(kind, stage_cfg, cfg.model_json, cfg.prompt_tokens, cfg.memory_gb)}
    if not cfg.json_output:
        print_plan(result)
    return result


def print_plan(r: dict) -> None:
    width = "4-bit" if r["bits"] == 4 else f"{r['bits']}-bit" if r["bits"] else {4: "float32", 2: "16-bit"}[r["value_bytes"]]
    print(f"{r['config']}: one {r['stage'].upper()} step of {r['model']} ({width}, {r['value_bytes']}-byte values); "
          f"{r['inputs']}")
    for name, value in r["items_gb"].items():
        print(f"  {name:<12}{value:8.2f} GB  {r['notes'].get(name, '')}")
    print(f"  {'peak':<12}{r['peak_gb']:8.2f} GB  {r['notes'].get('phase', '')}".rstrip())
    fits = ", ".join(str(s) for s in r["fits_mac_gb"]) or "none of " + ", ".join(str(s) for s in mp.MAC_SIZES_GB)
    print(f"fits Macs of {fits} GB (a working set of {mp.WORKING_SET_FRACTION:.0%} of memory)")
    how = " (its B x (G + 1) replies decoded in one batch)" if r["stage"] == "grpo" else ""
    print(f"largest {r['batch_field']}{how} within {r['budget_gb']:.1f} GB ({r['budget']}): {r['largest_batch']}")

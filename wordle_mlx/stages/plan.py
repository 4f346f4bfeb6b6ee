"""`wordle-mlx plan`: the expected peak memory of one SFT or GRPO step, before a run, and which Macs it fits.

Reads the stage config (an SFT or a GRPO config, told apart by loading it with each stage's strict loader)
and the model's `config.json`: from a local model folder, a builtin model, the Hugging Face cache for a Hub
id, or `--model-config FILE` (a config.json alone is enough; no weights are read). It turns both into the
numbers of `memory_plan.py` (one small function per stage reads the stage's fields, so a renamed field is
changed in one place), prints the itemised peak with its arithmetic, the Mac memory sizes whose ~75%
working set holds it, and the largest batch (SFT `batch_size`, GRPO `training.batch_prompts`) that fits
`--memory-gb` (default: this machine's recommended working set). `warn_if_over_working_set` is what `sft`
and `train` call before step 1: one line on stderr when the plan exceeds this machine's working set.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path

from ..config import StrictModel, load_config, read_json_file, resolve_path
from ..errors import UserError
from .. import memory_plan as mp

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CHARS_PER_TOKEN = 2.5       # Gemma 3's tokenizer on our prompts: 2.3 (compact) to 2.7 (full) characters a token
CHAT_TEMPLATE_TOKENS = 12   # <bos>, turn markers and role names around one system + user prompt
FALLBACK_TARGET_TOKENS = 16  # target tokens of an SFT example before its data exists: a letters reply's 11 + 2


class PlanConfig(StrictModel):
    config: str
    model_json: str | None = None
    memory_gb: float | None = None
    prompt_tokens: int | None = None
    json_output: bool = False


def stage_config(path: str):
    """(("sft" | "grpo"), config): whichever strict loader accepts the file; else one line naming both errors."""
    from .grpo_config import GRPOConfig
    from .sft import SFTConfig

    errors = []
    for kind, model in (("sft", SFTConfig), ("grpo", GRPOConfig)):
        try:
            return kind, load_config(path, model)
        except UserError as e:
            if "file not found" in str(e) or "invalid JSON" in str(e) or "is a folder" in str(e):
                raise
            errors.append(f"as {kind.upper()}: {str(e).removeprefix(str(path) + ': ')}")
    raise UserError(f"{path}: neither an SFT nor a GRPO config ({'; '.join(errors)})")


def model_config_dict(spec: str, explicit: str | None) -> dict:
    """The model's config.json as a dict: --model-config, a folder, a builtin, or the Hugging Face cache."""
    from ..llm.models import BUILTIN_PREFIX, HF_REPO_PATTERN, resolve_model

    if explicit is not None:
        path = Path(explicit)
        return read_json_object(path / "config.json" if path.is_dir() else path)
    if spec.startswith(BUILTIN_PREFIX):
        return read_json_object(Path(resolve_model(spec)) / "config.json")
    folder = Path(spec).expanduser()
    if (folder / "config.json").is_file():
        return read_json_object(folder / "config.json")
    if HF_REPO_PATTERN.match(spec) and not folder.exists():
        try:
            from huggingface_hub import try_to_load_from_cache
            cached = try_to_load_from_cache(spec, "config.json")
        except Exception:  # noqa: BLE001 - any cache problem means "not cached"
            cached = None
        if isinstance(cached, str):
            return read_json_object(Path(cached))
    raise UserError(f"model {spec!r}: no config.json found (not a folder with one, and not in the Hugging Face "
                    "cache); pass --model-config FILE")


def read_json_object(path: Path) -> dict:
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


def model_dims(config: dict, dtype: str | None, source: str, metal: bool) -> mp.ModelDims:
    """Dimensions as mlx-lm reads them (its ModelArgs fill the defaults the 4B's config leaves out), the value
    width our loader ends up with (`dtype`, else the checkpoint's own on Metal and float32 on CPU), and the
    quantization."""
    from mlx_lm.models import gemma3, gemma3_text

    kind = config.get("model_type")
    try:
        if kind == "gemma3":
            text = dict(config.get("text_config") or {})
            text.setdefault("model_type", "gemma3_text")
            wrapper = gemma3.ModelArgs(model_type="gemma3", text_config=text,
                                       **({"vocab_size": config["vocab_size"]} if "vocab_size" in config else {}))
            args = gemma3_text.ModelArgs.from_dict(wrapper.text_config)
        elif kind == "gemma3_text":
            args = gemma3_text.ModelArgs.from_dict(config)
        else:
            raise UserError(f"{source}: model_type {kind!r}: the planner knows Gemma 3 ('gemma3', 'gemma3_text')")
    except (TypeError, ValueError, AttributeError) as e:
        raise UserError(f"{source}: not a Gemma 3 config.json: {e}") from None
    stored = config.get("torch_dtype") or (config.get("text_config") or {}).get("torch_dtype") or "float32"
    chosen = dtype or (stored if metal else "float32")
    if chosen not in DTYPE_BYTES:
        raise UserError(f"{source}: torch_dtype {chosen!r}: expected one of {', '.join(DTYPE_BYTES)}")
    quant = config.get("quantization") or {}
    return mp.ModelDims(hidden=args.hidden_size, layers=args.num_hidden_layers, heads=args.num_attention_heads,
                        kv_heads=args.num_key_value_heads, head_dim=args.head_dim,
                        intermediate=args.intermediate_size, vocab=args.vocab_size,
                        sliding_window=args.sliding_window, sliding_window_pattern=args.sliding_window_pattern,
                        value_bytes=DTYPE_BYTES[chosen], bits=quant.get("bits"),
                        group_size=quant.get("group_size", 64))


def prompt_token_estimate(prompt) -> int:
    """Tokens of the longest prompt (five guesses on the board and a retry note), from its characters."""
    from ..game.feedback import feedback
    from ..llm.prompts import build_messages

    history = [(g, feedback(g, "vivid")) for g in ("crane", "pouty", "sight", "blimp", "fjord")]
    chars = sum(len(m["content"]) for m in build_messages(prompt, history, last_error=("not_a_word", "xxxxx")))
    return math.ceil(chars / CHARS_PER_TOKEN) + CHAT_TEMPLATE_TOKENS


def longest_example(cfg) -> tuple[int, int, int] | None:
    """(tokens, reply tokens, system-line tokens) of the longest record of an SFT config's train.jsonl, from
    its characters (CHARS_PER_TOKEN), or None before the data exists."""
    path = resolve_path(cfg, cfg.data) / "train.jsonl"
    if not path.is_file():
        return None
    longest, reply, system = 0, 0, 0
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            try:
                messages = json.loads(line)["messages"]
                chars = [len(m["content"]) for m in messages]
            except (ValueError, KeyError, TypeError):
                raise UserError(f"{path}: not the chat JSONL of `wordle-mlx data` (a record without messages)") from None
            longest, reply = max(longest, sum(chars)), max(reply, chars[-1])
            system = chars[0] if messages[0].get("role") == "system" else 0
    if longest == 0:
        return None
    return (math.ceil(longest / CHARS_PER_TOKEN) + CHAT_TEMPLATE_TOKENS + 2,
            math.ceil(reply / CHARS_PER_TOKEN) + 2, system // 3 + 4 if system else 0)


def sft_numbers(cfg, prompt_tokens: int | None) -> tuple[mp.SFTNumbers, str]:
    """The SFT fields the planner reads (one place to follow a renamed field)."""
    found, shared = longest_example(cfg), 0
    if found is not None:
        length, reply, system = found
        shared = system if cfg.share_prefix else 0   # <bos>, the turn marker and the system line, run once
        if prompt_tokens:
            length = prompt_tokens + reply
        length = min(cfg.max_seq_length, length)
        why = f"examples of up to {length} tokens, {reply} of them targets (the longest record in {cfg.data})"
    else:
        length, reply = cfg.max_seq_length, FALLBACK_TARGET_TOKENS
        why = (f"examples of max_seq_length {length} tokens with {reply} targets each, as a letters reply has (no "
               f"{cfg.data}/train.jsonl yet: make the data first for a closer plan)")
    numbers = mp.SFTNumbers(batch_size=cfg.batch_size, row_length=length, reply_tokens=reply, pad_to=cfg.pad_to,
                            rank=cfg.lora.rank, num_layers=cfg.lora.num_layers,
                            keys=tuple(cfg.lora.keys) if cfg.lora.keys else None,
                            grad_checkpoint=cfg.grad_checkpoint, grad_accumulation=cfg.grad_accumulation,
                            shared_prefix=shared)
    return numbers, why


def grpo_numbers(cfg, prompt_tokens: int | None) -> tuple[mp.GRPONumbers, str]:
    """The GRPO fields the planner reads (one place to follow a renamed field). With an existing
    model.start_adapter, LoRA's size is the adapter's own; else the config's lora section."""
    t, rl = cfg.training, cfg.rl
    rank, num_layers, keys = cfg.lora.rank, cfg.lora.num_layers, cfg.lora.keys
    if cfg.model.start_adapter:
        adapter = resolve_path(cfg, cfg.model.start_adapter) / "adapter_config.json"
        if adapter.is_file():
            params = read_json_object(adapter).get("lora_parameters", {})
            rank, keys = params.get("rank", rank), params.get("keys", keys)
            num_layers = read_json_object(adapter).get("num_layers", num_layers)
    greedy = 1 if rl.mode == "turn" and rl.turn_continue == "greedy" else 0
    prompt = prompt_tokens or prompt_token_estimate(rl.prompt)
    states = 2 if t.optimizer == "adamw" else 0      # sgd keeps no state
    numbers = mp.GRPONumbers(
        batch_prompts=t.batch_prompts, generations=rl.num_generations + greedy, prompt_tokens=prompt,
        reply_tokens=rl.max_completion_tokens, completion_batch_size=rl.completion_batch_size,
        max_tokens_per_microbatch=t.max_tokens_per_microbatch,
        max_loss_tokens_per_microbatch=t.max_loss_tokens_per_microbatch, rank=rank, num_layers=num_layers,
        keys=tuple(keys) if keys else None, optimizer_states=states,
        grad_checkpoint=bool(getattr(t, "grad_checkpoint", False)), share_prompts=rl.mode == "turn")
    return numbers, f"prompts of about {prompt} tokens, replies of up to {rl.max_completion_tokens}"


def stage_parts(kind: str, cfg):
    """(model spec, dtype, numbers function, batch field name) of a loaded stage config."""
    if kind == "sft":
        return cfg.model, cfg.dtype, sft_numbers, "batch_size"
    return cfg.model.name, cfg.model.dtype, grpo_numbers, "batch_prompts"


def plan_for(kind: str, dims: mp.ModelDims, numbers) -> mp.MemoryPlan:
    return mp.sft_plan(dims, numbers) if kind == "sft" else mp.grpo_plan(dims, numbers)


def with_batch(kind: str, numbers, n: int):
    """`numbers` with batch n: SFT's batch_size; GRPO's batch_prompts with all its replies decoded at once
    (completion_batch_size = n x G; micro-batches cap the update, so batch_prompts alone would not raise the peak)."""
    if kind == "sft":
        return dataclasses.replace(numbers, batch_size=n)
    return dataclasses.replace(numbers, batch_prompts=n, completion_batch_size=n * numbers.generations)


def this_machine_working_set() -> tuple[float, str]:
    """(bytes, where from): Metal's recommended working set, else this machine's RAM."""
    from ..llm.models import metal_available

    if metal_available():
        import mlx.core as mx
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        return float(info["max_recommended_working_set_size"]), "Metal's recommended working set"
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "this machine's RAM"


def build_plan(kind: str, cfg, model_config: str | None = None, prompt_tokens: int | None = None):
    from ..llm.models import metal_available

    spec, dtype, numbers_of, batch_field = stage_parts(kind, cfg)
    source = model_config or f"model {spec!r} config.json"
    dims = model_dims(model_config_dict(spec, model_config), dtype, source, metal_available())
    numbers, why = numbers_of(cfg, prompt_tokens)
    return dims, numbers, why, batch_field


def run(cfg: PlanConfig) -> dict:
    kind, stage_cfg = stage_config(cfg.config)
    dims, numbers, why, batch_field = build_plan(kind, stage_cfg, cfg.model_json, cfg.prompt_tokens)
    plan = plan_for(kind, dims, numbers)
    budget, where = ((mp.working_set(cfg.memory_gb), f"{cfg.memory_gb:g} GB x {mp.WORKING_SET_FRACTION:.0%}")
                     if cfg.memory_gb else this_machine_working_set())
    largest = mp.largest_fitting(lambda n: plan_for(kind, dims, with_batch(kind, numbers, n)), budget)
    result = {"config": cfg.config, "stage": kind, "model": stage_parts(kind, stage_cfg)[0],
              "value_bytes": dims.value_bytes, "bits": dims.bits, "inputs": why,
              "items_gb": {k: round(mp.gb(v), 3) for k, v in plan.items.items()},
              "notes": plan.notes, "peak_gb": round(mp.gb(plan.peak), 3),
              "fits_mac_gb": mp.fitting_sizes(plan.peak), "budget_gb": round(mp.gb(budget), 2), "budget": where,
              "batch_field": batch_field, "largest_batch": largest}
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
    how = " with completion_batch_size = batch_prompts x G" if r["stage"] == "grpo" else ""
    print(f"largest {r['batch_field']}{how} within {r['budget_gb']:.1f} GB ({r['budget']}): {r['largest_batch']}")


def warn_if_over_working_set(kind: str, cfg) -> None:
    """One line on stderr when the plan of `cfg` exceeds this machine's working set (silent if it cannot plan)."""
    try:
        dims, numbers, _, _ = build_plan(kind, cfg)
    except UserError:
        return
    peak, (budget, where) = plan_for(kind, dims, numbers).peak, this_machine_working_set()
    if peak > budget:
        print(f"warning: the memory plan of this {kind} step is {mp.gb(peak):.1f} GB, over {where} "
              f"({mp.gb(budget):.1f} GB); see `wordle-mlx plan --config FILE`", file=sys.stderr)

"""A stage config and its model's config.json into the numbers of `memory.py`, and the plan they give.

The model side (`model_config_dict`, `model_dims`) finds the model's config.json (`--model-config FILE`, a local
folder, a builtin model, the Hugging Face cache for a Hub id, or, before any download, the known dimensions of the
Gemma 3 checkpoints of `gemma3_sizes.py`) and reads it as mlx-lm does, with the value width our loader ends up
with. The stage side has one small function per stage kind (`sft_numbers`, `grpo_numbers`, `eval_numbers`,
`self_play_numbers`) that reads the stage's fields, so a renamed field is changed in one place, in the decoding
mode the config uses (grammar and words decoding keep 26-entry logit rows, free decoding vocabulary-wide ones).
`plan_report` is what `wordle-mlx plan` prints: the itemised peak, the Mac memory sizes whose working set holds it
(`memory.working_set`: two thirds of memory up to 32 GB, three quarters above) and the largest batch that fits a
budget (default: this machine's working set, Metal's recommended size on a Mac).
`warn_if_over_working_set` is what `sft` and `train` call before step 1: one line on stderr when the plan exceeds
this machine's working set.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models import gemma3, gemma3_text

from ..config import read_json_file, resolve_path
from ..errors import UserError
from ..runtime import device
from ..game.feedback import feedback
from ..llm.model.models import BUILTIN_PREFIX, HF_REPO_PATTERN, resolve_model
from ..llm.play.prompts import PromptConfig, adapter_prompt, build_messages
from ..llm.play.reply_grammar import effective_mode
from ..stages.grpo_config import ROLLOUT_BATCH
from . import memory as mp
from .gemma3_sizes import known_config

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CHARS_PER_TOKEN = 2.5       # Gemma 3's tokenizer on our prompts: 2.3 (compact) to 2.7 (full) characters a token
CHAT_TEMPLATE_TOKENS = 12   # <bos>, turn markers and role names around one system + user prompt
FALLBACK_TARGET_TOKENS = 16  # target tokens of an SFT example before its data exists: a letters reply's 11 + 2


def model_config_dict(spec: str, explicit: str | None) -> dict:
    """The model's config.json as a dict: --model-config, a folder, a builtin, the Hugging Face cache, or the
    known dimensions of a Gemma 3 repo id (before the download)."""

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
        known = known_config(spec)
        if known is not None:
            return known
    raise UserError(f"model {spec!r}: no config.json found (not a folder with one, not in the Hugging Face cache, "
                    "and not a Gemma 3 270M / 1B / 4B / 12B repo id); pass --model-config FILE")


def read_json_object(path: Path) -> dict:
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


def model_dims(config: dict, dtype: str | None, source: str, keeps_stored: bool) -> mp.ModelDims:
    """Dimensions as mlx-lm reads them (its ModelArgs fill the defaults the 4B's config leaves out), the value
    width our loader ends up with (`dtype`, else the checkpoint's own where the default dtype is not float32 (a GPU,
    or WORDLE_MLX_DEFAULT_DTYPE: `keeps_stored`) and float32 on CPU), and the quantization."""
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
    chosen = dtype or (stored if keeps_stored else "float32")
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
    history = [(g, feedback(g, "vivid")) for g in ("crane", "pouty", "sight", "blimp", "fjord")]
    chars = sum(len(m["content"]) for m in build_messages(prompt, history, last_error=("not_a_word", "xxxxx")))
    return math.ceil(chars / CHARS_PER_TOKEN) + CHAT_TEMPLATE_TOKENS


def longest_example(cfg) -> tuple[int, int, int] | None:
    """(tokens, reply tokens, system-line tokens) of the longest record of an SFT config's train.jsonl, from
    its characters (CHARS_PER_TOKEN), or None before the data exists."""
    path = resolve_path(cfg, cfg.data.folder) / "train.jsonl"
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
        shared = system                  # <bos>, the turn marker and the system line, run once
        if prompt_tokens:
            length = prompt_tokens + reply
        length = min(cfg.data.max_seq_length, length)
        why = f"examples of up to {length} tokens, {reply} of them targets (the longest record in {cfg.data.folder})"
    else:
        length, reply = cfg.data.max_seq_length, FALLBACK_TARGET_TOKENS
        why = (f"examples of max_seq_length {length} tokens with {reply} targets each, as a letters reply has (no "
               f"{cfg.data.folder}/train.jsonl yet: make the data first for a closer plan)")
    rank, num_layers, keys = adapter_layout(cfg, cfg.model.adapter, cfg.lora.rank, cfg.lora.num_layers, None)
    numbers = mp.SFTNumbers(batch_size=cfg.data.batch_size, row_length=length, reply_tokens=reply,
                            pad_to=cfg.data.pad_to, rank=rank, num_layers=num_layers,
                            keys=tuple(keys) if keys else None, grad_checkpoint=cfg.model.grad_checkpoint,
                            shared_prefix=shared, train_layers=cfg.lora.train_layers,
                            grammar_loss=cfg.decode != "free", train_free=cfg.train_free,
                            numpy_loss=not device.has_gpu())
    return numbers, why


def adapter_layout(cfg, adapter: str | None, rank: int, num_layers: int, keys):
    """(rank, num_layers, keys) of an existing adapter folder's adapter_config.json, else the given ones."""
    if adapter:
        path = resolve_path(cfg, adapter) / "adapter_config.json"
        if path.is_file():
            config = read_json_object(path)
            params = config.get("lora_parameters", {})
            return params.get("rank", rank), config.get("num_layers", num_layers), params.get("keys", keys)
    return rank, num_layers, keys


def grpo_numbers(cfg, prompt_tokens: int | None) -> tuple[mp.GRPONumbers, str]:
    """The GRPO fields the planner reads (one place to follow a renamed field). With an existing model.adapter,
    LoRA's size and the prompt are the adapter's own; else the config's lora section and the default prompt."""
    rl = cfg.rl
    rank, num_layers, keys = adapter_layout(cfg, cfg.model.adapter, cfg.lora.rank, cfg.lora.num_layers, None)
    prompt_cfg = (adapter_prompt(resolve_path(cfg, cfg.model.adapter)) if cfg.model.adapter else None) or PromptConfig()
    prompt = prompt_tokens or prompt_token_estimate(prompt_cfg)
    states = 2 if cfg.optimizer.name == "adamw" else 1   # mlx's SGD keeps a velocity per weight, momentum or not
    numbers = mp.GRPONumbers(
        batch_prompts=rl.batch_prompts, generations=rl.num_generations + 1, prompt_tokens=prompt,
        reply_tokens=cfg.max_tokens, completion_batch_size=ROLLOUT_BATCH,
        max_tokens_per_microbatch=rl.max_tokens_per_microbatch,
        max_loss_tokens_per_microbatch=rl.max_loss_tokens_per_microbatch, rank=rank, num_layers=num_layers,
        keys=tuple(keys) if keys else None, optimizer_states=states, grad_checkpoint=cfg.model.grad_checkpoint,
        share_prompts=True, decode=decode_mode(cfg.decode, prompt_cfg), train_layers=cfg.lora.train_layers)
    return numbers, (f"prompts of about {prompt} tokens, replies of up to {cfg.max_tokens}, "
                     f"{numbers.decode} decoding")


def decode_mode(mode: str, prompt) -> str:
    """The decoding a stage really uses: free for a format with free text (`reply_grammar.effective_mode`)."""
    return effective_mode(mode, prompt, False)


def eval_numbers(cfg, prompt_tokens: int | None) -> tuple[mp.DecodeNumbers, str]:
    """An eval config: its games in lockstep, every board distinct, in chunks of completion_batch_size."""
    r = cfg.rollout
    rank, num_layers, keys = adapter_layout(cfg, cfg.adapter, 0, -1, None)
    prompt = prompt_tokens or prompt_token_estimate(r.prompt)
    numbers = mp.DecodeNumbers(rows=cfg.games, distinct_prompts=cfg.games, prompt_tokens=prompt,
                               reply_tokens=r.max_tokens_per_turn, completion_batch_size=r.completion_batch_size,
                               rank=rank, num_layers=num_layers, keys=tuple(keys) if keys else None,
                               decode=decode_mode(r.decode, r.prompt))
    return numbers, (f"{cfg.games} games in lockstep, prompts of about {prompt} tokens, {numbers.decode} decoding"
                     + ("" if rank else " (LoRA not counted: no adapter_config.json yet)"))


def self_play_numbers(cfg, prompt_tokens: int | None) -> tuple[mp.DecodeNumbers, str]:
    """A self-play config: one board at a time, its fitting answers scored score_chunk at a time."""
    prompt_cfg = cfg.prompt or PromptConfig()
    rank, num_layers, keys = adapter_layout(cfg, cfg.adapter, 0, -1, None)
    prompt = prompt_tokens or prompt_token_estimate(prompt_cfg)
    numbers = mp.DecodeNumbers(rows=cfg.score_chunk, distinct_prompts=1, prompt_tokens=prompt, reply_tokens=16,
                               completion_batch_size=cfg.score_chunk, rank=rank, num_layers=num_layers,
                               keys=tuple(keys) if keys else None, decode=decode_mode(cfg.decode, prompt_cfg))
    return numbers, (f"{cfg.score_chunk} candidate replies scored a pass, prompts of about {prompt} tokens, "
                     f"{numbers.decode} scoring" + ("" if rank else " (LoRA not counted: no adapter_config.json yet)"))


def stage_parts(kind: str, cfg):
    """(model spec, dtype, numbers function, batch field name) of a loaded stage config."""
    if kind == "sft":
        return cfg.model.name, cfg.model.dtype, sft_numbers, "data.batch_size"
    if kind == "grpo":
        return cfg.model.name, cfg.model.dtype, grpo_numbers, "rl.batch_prompts"
    if kind == "eval":
        return cfg.model, cfg.dtype, eval_numbers, "rollout.completion_batch_size"
    return cfg.model, cfg.dtype, self_play_numbers, "score_chunk"


def plan_for(kind: str, dims: mp.ModelDims, numbers) -> mp.MemoryPlan:
    if kind == "sft":
        return mp.sft_plan(dims, numbers)
    return mp.grpo_plan(dims, numbers) if kind == "grpo" else mp.decode_plan(dims, numbers)


def with_batch(kind: str, numbers, n: int):
    """`numbers` with batch n: SFT's batch_size; GRPO's batch_prompts with all its replies decoded at once
    (n x (G + 1) rows, where a run decodes 64 at a time; micro-batches cap the update, so batch_prompts alone
    would not raise the peak); eval's and self-play's rows decoded or scored together."""
    if kind == "sft":
        return dataclasses.replace(numbers, batch_size=n)
    if kind == "grpo":
        return dataclasses.replace(numbers, batch_prompts=n, completion_batch_size=n * numbers.generations)
    return dataclasses.replace(numbers, rows=max(n, numbers.rows), completion_batch_size=n,
                               distinct_prompts=min(numbers.distinct_prompts, n) if kind == "self-play"
                               else max(n, numbers.distinct_prompts))


def this_machine_working_set() -> tuple[float, str]:
    """(bytes, where from): Metal's recommended working set, else this machine's RAM."""
    if device.has_gpu():
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        if "max_recommended_working_set_size" in info:     # Metal reports it; a CUDA device may not
            return float(info["max_recommended_working_set_size"]), "Metal's recommended working set"
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "this machine's RAM"


def build_plan(kind: str, cfg, model_config: str | None = None, prompt_tokens: int | None = None):

    spec, dtype, numbers_of, batch_field = stage_parts(kind, cfg)
    source = model_config or f"model {spec!r} config.json"
    dims = model_dims(model_config_dict(spec, model_config), dtype, source, device.default_dtype() != "float32")
    numbers, why = numbers_of(cfg, prompt_tokens)
    return dims, numbers, why, batch_field


def plan_report(kind: str, cfg, model_config: str | None = None, prompt_tokens: int | None = None,
                memory_gb: float | None = None) -> dict:
    """The plan of the loaded stage config `cfg` of `kind`: the itemised peak with its inputs, the Mac sizes it
    fits, and the largest batch within `memory_gb` x the working-set share (default: this machine's)."""
    dims, numbers, why, batch_field = build_plan(kind, cfg, model_config, prompt_tokens)
    plan = plan_for(kind, dims, numbers)
    budget, where = ((mp.working_set(memory_gb), mp.working_set_note(memory_gb))
                     if memory_gb else this_machine_working_set())
    largest = mp.largest_fitting(lambda n: plan_for(kind, dims, with_batch(kind, numbers, n)), budget)
    return {"stage": kind, "model": stage_parts(kind, cfg)[0],
            "value_bytes": dims.value_bytes, "bits": dims.bits, "inputs": why,
            "items_gb": {k: round(mp.gb(v), 3) for k, v in plan.items.items()},
            "notes": plan.notes, "peak_gb": round(mp.gb(plan.peak), 3),
            "fits_mac_gb": mp.fitting_sizes(plan.peak), "budget_gb": round(mp.gb(budget), 2), "budget": where,
            "batch_field": batch_field, "largest_batch": largest}


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

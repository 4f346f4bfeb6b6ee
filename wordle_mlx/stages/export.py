"""`wordle-mlx export`: a trained player as one GGUF file for llama.cpp, its reply grammar, and an Ollama Modelfile.

Loads the base model with the LoRA adapter (mlx-lm's loader; a float model in its stored dtype), and writes every text weight of the Gemma 3 model with
the LoRA fused in float32 (W + scale * B^T A^T, as mlx-lm's `fuse` computes it, but in float32 whatever the base
dtype; a 4-bit base is dequantised first), one tensor at a time, through `llm.model.gguf_export` as `dtype` float32,
float16 or q8 (GGUF's f32, f16, q8_0). Only text weights are written: a Gemma 3 4B folder's vision tower and
projector are left out, and the output says so. The tokenizer comes from the bundled GGUF for
`builtin:gemma-3-270m`, from the source `.gguf` for GGUF models, from `tokenizer.model` (SentencePiece) of a model
folder when it has one, else from its `tokenizer.json`. The GGUF also records the adapter's prompt format
(`wordle_mlx.prompt`, `wordle_mlx.system_prompt`) and, when the adapter records them, the decoding it was trained
for and whether its whole reply was trained over the vocabulary (`wordle_mlx.decode`, `wordle_mlx.trained_free`). Beside it go a GBNF
grammar for the decoding the adapter records (`grammar` when it records none): `NAME.gbnf` (`llm.play.gbnf`), with
`NAME.logit_bias.json`, the tokens a reply never takes, banned (llama-server's `logit_bias` value), so that
llama.cpp spells a reply with the decoder's own tokens; usage
notes for llama.cpp and llama-cpp-python (`NAME.llamacpp.md`) and, for a player that can play free, the Ollama
Modelfile (`NAME.Modelfile`; `export_files`). Ollama takes no grammar: an adapter that records that its reply tags
were never trained gets no Modelfile (with a one-line warning), and `--ollama` with such an adapter is refused
before anything is written. Every file is written to a temporary file and renamed only once all are written, so a
failure leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import struct
import sys
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.tuner.lora import LoRALinear
from ..config import display_path, read_json_file, resolve_path
from ..errors import UserError
from ..storage.fileio import atomic_path
from ..game.words import guess_list
from ..llm.model.gguf_export import Vocab, folder_vocab, text_args, vocab_from_gguf, write_gguf
from ..llm.model.gguf_import import bundled_gemma_270m_gguf
from ..llm.model.models import BUILTIN_PREFIX, load_model, local_model_folder, resolve_model
from ..llm.model.tiny_model import tiny_vocab
from ..llm.model.tokenizer_build import GEMMA3_CHAT_TEMPLATE
from ..llm.play.gbnf import banned_token_ids, check_reply_gbnf, logit_bias_json, reply_gbnf, reply_pieces
from ..llm.play.prompts import PromptConfig, adapter_prompt, build_messages, describe_state, system_prompt
from ..llm.play.reply_grammar import adapter_decoding, effective_mode
from ..planning.fuse_plan import stored_float_dtype
from ..planning.stage_plan import model_config_dict
from ..runtime.progress import console
from .export_files import LOGIT_BIAS_SUFFIX, STOP_PIECE, USAGE_SUFFIX, modelfile_text, usage_text
from .export_config import ExportConfig
from .precision import GGUF_TYPES

DEFAULT_MODEL = "builtin:gemma-3-270m"
NON_TEXT_PREFIXES = ("vision_tower.", "multi_modal_projector.")
META_PROMPT, META_SYSTEM = "wordle_mlx.prompt", "wordle_mlx.system_prompt"


def stored_dtype(spec: str) -> str | None:
    """The float dtype the model stores its weights in, to load them as they are: every tensor is written fused in
    float32 one at a time, so a float32 copy of a bf16 model (twice its size) is never needed. None (the
    loader's default: float32 scales, dequantized exactly) for a quantized model or one whose config is not found."""
    try:
        return stored_float_dtype(model_config_dict(spec, None))
    except UserError:
        return None


def read_adapter(folder: Path) -> dict:
    """The adapter's config, after checking the folder holds a LoRA adapter in mlx-lm's format."""
    if not folder.is_dir():
        raise UserError(f"adapter {folder}: no such folder")
    for needed in ("adapter_config.json", "adapters.safetensors"):
        if not (folder / needed).is_file():
            raise UserError(f"adapter {folder}: missing {needed}")
    config = read_json_file(folder / "adapter_config.json")
    if not isinstance(config, dict):
        raise UserError(f"{folder / 'adapter_config.json'}: expected a JSON object")
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise UserError(f"{folder / 'adapter_config.json'}: fine_tune_type {kind!r}; export supports 'lora' adapters")
    return config


def dense_weight(module):
    """A linear/embedding/norm module's weight as float32, dequantised if the module is quantised."""
    if "scales" in module:
        return mx.dequantize(module.weight, module.scales, module.get("biases"), group_size=module.group_size,
                             bits=module.bits, mode=getattr(module, "mode", "affine")).astype(mx.float32)
    return module.weight.astype(mx.float32)


def dense_shape(module) -> tuple:
    if "scales" in module:
        return (module.weight.shape[0], module.scales.shape[-1] * module.group_size)
    return tuple(module.weight.shape)


def fused_lora_weight(module):
    """W + scale * B^T A^T in float32 (mlx-lm's LoRALinear.fuse, without rounding the update to W's dtype)."""
    a, b = module.lora_a.astype(mx.float32), module.lora_b.astype(mx.float32)
    return dense_weight(module.linear) + (module.scale * b.T) @ a.T


def to_numpy(produce, rows: int | None = None):
    values = produce()
    if rows is not None:
        values = values[:rows]
    mx.eval(values)
    return np.array(values, dtype=np.float32)


def natural_key(name: str) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split(".")]


def text_weight_sources(text, vocab_size: int) -> list[tuple]:
    """(mlx name, shape, producer) for every weight of the Gemma 3 text model, LoRA fused in.

    Embedding (and untied output) rows past the tokenizer's vocabulary are dropped, as llama.cpp's
    converter does (Gemma 3 4B pads 262144 pieces to 262208 rows)."""
    modules = dict(text.named_modules())
    lora = [name for name, m in modules.items() if isinstance(m, LoRALinear)]
    sources = []
    for name, module in sorted(modules.items(), key=lambda item: natural_key(item[0])):
        if any(name.startswith(prefix + ".") for prefix in lora):
            continue
        if not isinstance(module, LoRALinear) and "weight" not in module:
            continue
        if hasattr(module, "fuse") and not isinstance(module, LoRALinear):
            raise UserError(f"layer {name}: {type(module).__name__} adapters are not supported by export (LoRA only)")
        base = module.linear if isinstance(module, LoRALinear) else module
        shape = dense_shape(base)
        produce = partial(fused_lora_weight, module) if isinstance(module, LoRALinear) else partial(dense_weight, module)
        rows = None
        if name in ("model.embed_tokens", "lm_head"):
            if shape[0] < vocab_size:
                raise UserError(f"{name} has {shape[0]} rows but the tokenizer has {vocab_size} pieces")
            rows, shape = vocab_size, (vocab_size, *shape[1:])
        sources.append((f"{name}.weight", shape, partial(to_numpy, produce, rows)))
    return sources


def export_vocab(spec: str, folder: Path | None):
    if spec == BUILTIN_PREFIX + "gemma-3-270m":
        return vocab_from_gguf(bundled_gemma_270m_gguf())
    if spec == BUILTIN_PREFIX + "tiny-random":
        return Vocab(*tiny_vocab(), source=spec)
    if spec.lower().endswith(".gguf"):
        return vocab_from_gguf(Path(spec).expanduser())
    return folder_vocab(folder)


def check_vocab(vocab, tokenizer) -> None:
    """The exported vocabulary must give the chat pieces the ids the model was trained with."""
    for piece in ("<bos>", "<eos>", "<start_of_turn>", STOP_PIECE):
        ours, theirs = vocab.id_of(piece), tokenizer.convert_tokens_to_ids(piece)
        if ours != theirs:
            raise UserError(f"tokenizer {vocab.source}: {piece} has id {ours} but the model's tokenizer says {theirs}")


def non_text_tensors(folder: Path | None) -> int:
    """How many vision/projector tensors the model folder holds (from the safetensors headers)."""
    if folder is None:
        return 0
    names = []
    for path in sorted(folder.glob("model*.safetensors")):
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            names += list(json.loads(fh.read(size)))
    return sum(1 for n in names if n.startswith(NON_TEXT_PREFIXES)
               or n.removeprefix("model.").startswith(NON_TEXT_PREFIXES))


def outputs(out: Path, mode: str, modelfile: bool) -> dict[str, Path | None]:
    """The files one export writes: the GGUF, its grammar and logit bias (none in free decoding), usage notes,
    Modelfile."""
    return {"gguf": out, "grammar": out.with_suffix(".gbnf") if mode != "free" else None,
            "logit_bias": out.with_suffix(LOGIT_BIAS_SUFFIX) if mode != "free" else None,
            "usage": out.with_name(out.stem + USAGE_SUFFIX), "modelfile": out.with_suffix(".Modelfile") if modelfile else None}


def ollama_choice(cfg: ExportConfig, adapter: Path, recorded: str | None, trained_free: bool | None) -> tuple[bool, str | None]:
    """(write the Modelfile?, why not): Ollama decodes free, which an adapter whose whole reply was never trained over
    the vocabulary cannot play."""
    if cfg.ollama is False:
        return False, "not asked for (--no-ollama)"
    if trained_free is not False:
        return True, None
    why = (f"adapter {display_path(adapter)} was trained for {recorded} decoding, never on its whole reply over the "
           "vocabulary (adapter_config.json), and Ollama takes no grammar: in free decoding it loses its games on format errors")
    if cfg.ollama:
        raise UserError(f"--ollama: {why}; export without --ollama for the GGUF and its llama.cpp grammar")
    return False, why


def run(cfg: ExportConfig) -> dict:
    start = time.perf_counter()
    out, adapter = resolve_path(cfg, cfg.out), resolve_path(cfg, cfg.adapter)
    if out.suffix.lower() != ".gguf":
        raise UserError(f"out: {cfg.out!r} must end in .gguf")
    adapter_cfg = read_adapter(adapter)
    recorded = adapter_prompt(adapter)
    prompt = recorded or PromptConfig()
    decode, trained_free = adapter_decoding(adapter)
    mode = effective_mode(decode or "grammar", prompt, explicit=False)     # free for a format with free text
    write_modelfile, no_modelfile = ollama_choice(cfg, adapter, decode, trained_free)
    files = outputs(out, mode, write_modelfile)
    every = outputs(out, "grammar", True)
    existing = [p for p in every.values() if p.exists()]
    if not cfg.overwrite and existing:
        raise UserError(f"out: {display_path(existing[0])} already exists; pass --overwrite to replace it")
    if no_modelfile and cfg.ollama is None:
        print(f"warning: {no_modelfile}; writing the GGUF and its llama.cpp grammar, no Ollama Modelfile",
              file=sys.stderr)
    spec = cfg.model or adapter_cfg.get("base_model") or DEFAULT_MODEL
    model, tokenizer = load_model(spec, adapter_path=adapter, dtype=stored_dtype(spec))
    text = getattr(model, "language_model", model)
    args = text_args(model, spec)
    folder = local_model_folder(resolve_model(spec))   # a Hub id: downloaded by mlx-lm's loader already
    vocab = export_vocab(spec, folder)
    check_vocab(vocab, tokenizer)
    quantized = "scales" in text.model.embed_tokens
    sources = text_weight_sources(text, len(vocab.pieces))
    system = system_prompt(prompt)
    extra = {META_PROMPT: json.dumps(prompt.model_dump(), sort_keys=True), META_SYSTEM: system,
             "wordle_mlx.base_model": spec, "wordle_mlx.adapter": adapter.name}
    if decode is not None:
        extra["wordle_mlx.decode"] = decode
    if trained_free is not None:
        extra["wordle_mlx.trained_free"] = "true" if trained_free else "false"
    source = f"{spec} + {adapter.name}"
    texts = {}
    if files["grammar"] is not None:
        pieces = reply_pieces(tokenizer)
        texts["grammar"] = reply_gbnf(mode, pieces, guess_list())
        check_reply_gbnf(texts["grammar"], pieces, files["grammar"].name)
        texts["logit_bias"] = logit_bias_json(banned_token_ids(tokenizer, len(vocab.pieces)))
    board = build_messages(prompt, [])[-1]["content"]
    texts["usage"] = usage_text(out.name, source, mode, decode, files["grammar"] and files["grammar"].name, system,
                                board, files["logit_bias"] and files["logit_bias"].name, spec, files["modelfile"] and files["modelfile"].name, no_modelfile)
    if files["modelfile"] is not None:
        texts["modelfile"] = modelfile_text(out.name, system, describe_state([], style=prompt.style), source)
    if not cfg.json_output:
        console.print(f"exporting {spec} + adapter {display_path(adapter)} -> {display_path(out)} ({cfg.dtype}, "
                      "LoRA fused in float32"
                      + (", dequantised from the quantised base" if quantized else "") + ")")
    with contextlib.ExitStack() as stack:      # every file renamed into place only when all are written
        for key, body in texts.items():
            stack.enter_context(atomic_path(files[key])).write_text(body)
        counts = write_gguf(stack.enter_context(atomic_path(out)), args, sources, vocab, gguf_type=GGUF_TYPES[cfg.dtype],
                            chat_template=getattr(tokenizer, "chat_template", None) or GEMMA3_CHAT_TEMPLATE,
                            name=f"{adapter.name} ({spec} + LoRA)", extra=extra)
    stale = [p for key, p in every.items() if files[key] is None and p.exists()]
    for path in stale:          # --overwrite: an earlier export's grammar or Modelfile would describe another GGUF
        path.unlink()
    skipped = non_text_tensors(folder)
    shown = {key: display_path(p) if p is not None else None for key, p in files.items()}
    result = {"out": shown["gguf"], "grammar": shown["grammar"], "logit_bias": shown["logit_bias"], "usage": shown["usage"], "modelfile": shown["modelfile"],
              "no_modelfile_reason": no_modelfile, "removed": [display_path(p) for p in stale],
              "dtype": cfg.dtype, "gguf_type": GGUF_TYPES[cfg.dtype], "model": spec,
              "adapter": display_path(adapter), "tensors": counts["tensors"], "vocab": counts["vocab"],
              "tokenizer": vocab.source, "non_text_tensors_left_out": skipped, "dequantized": quantized,
              "prompt": "recorded by the adapter" if recorded else "default (the adapter records none)",
              "decode": decode, "trained_free": trained_free, "grammar_decode": mode,
              "size_mb": round(out.stat().st_size / 1e6, 1), "seconds": round(time.perf_counter() - start, 1)}
    if not cfg.json_output:
        written = ", ".join(p.name for key, p in files.items() if p is not None and key != "gguf")
        console.print(f"wrote {result['out']} ({result['size_mb']} MB, {result['tensors']} tensors, "
                      f"{result['vocab']} tokens) and {written}; text weights only"
                      + (f" ({skipped} vision/projector tensors left out)" if skipped else "")
                      + f"; prompt format {result['prompt']}; {mode} decoding; tokenizer from {vocab.source}")
    return result

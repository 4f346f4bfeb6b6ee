"""`wordle-mlx export`: a trained player as one GGUF file for llama.cpp, plus an Ollama Modelfile.

Loads the base model with the LoRA adapter (mlx-lm's loader), and writes every text weight of the
Gemma 3 model with the LoRA fused in float32 (W + scale * B^T A^T, as mlx-lm's `fuse` computes it, but
in float32 whatever the base dtype; a 4-bit base is dequantised first), one tensor at a time, through
`llm.gguf_export` as f32, f16 or q8_0. Only text weights are written: a Gemma 3 4B folder's vision
tower and projector are left out, and the output says so. The tokenizer comes from the bundled GGUF
for `builtin:gemma-3-270m`, from the source `.gguf` for GGUF models, from `tokenizer.model`
(SentencePiece) of a model folder when it has one, else from its `tokenizer.json`. The GGUF also
records the adapter's prompt format (`wordle_mlx.prompt`, `wordle_mlx.system_prompt`) and, when the adapter records
them, the decoding it was trained for and whether its reply tags were trained (`wordle_mlx.decode`,
`wordle_mlx.trained_tags`); llama.cpp and Ollama decode free, so an adapter whose tags were never trained gets a
one-line warning. The Modelfile
beside it (`NAME.Modelfile`) has Gemma's chat template as an Ollama template, the system line the
adapter was trained with, `<end_of_turn>` as stop token and temperature 0 (greedy play). Both files are
written to temporary files and renamed, so a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import struct
import sys
import time
from functools import partial
from pathlib import Path
from typing import Literal, Optional

from ..config import StrictModel, display_path, read_json_file, resolve_path
from ..errors import UserError
from ..progress import console

DEFAULT_MODEL = "builtin:gemma-3-270m"
NON_TEXT_PREFIXES = ("vision_tower.", "multi_modal_projector.")
STOP_PIECE = "<end_of_turn>"
META_PROMPT, META_SYSTEM = "wordle_mlx.prompt", "wordle_mlx.system_prompt"

# Gemma 3's chat template (tokenizer_build.GEMMA3_CHAT_TEMPLATE) in Ollama's Go template language: the
# system line opens the first user turn, followed by a blank line. Ollama adds <bos> itself.
OLLAMA_TEMPLATE = """{{- $system := "" }}
{{- range $i, $m := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq $m.Role "system" }}{{ $system = $m.Content }}
{{- else if eq $m.Role "user" }}<start_of_turn>user
{{ if $system }}{{ $system }}

{{ $system = "" }}{{ end }}{{ $m.Content }}<end_of_turn>
{{ if $last }}<start_of_turn>model
{{ end }}
{{- else if eq $m.Role "assistant" }}<start_of_turn>model
{{ $m.Content }}{{ if not $last }}<end_of_turn>
{{ end }}
{{- end }}
{{- end }}"""


class ExportConfig(StrictModel):
    adapter: str
    out: str
    model: Optional[str] = None          # default: the adapter's base_model, else builtin:gemma-3-270m
    gguf_type: Literal["f32", "f16", "q8_0"] = "f32"
    overwrite: bool = False
    json_output: bool = False


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
    import mlx.core as mx

    if "scales" in module:
        return mx.dequantize(module.weight, module.scales, module.get("biases"), group_size=module.group_size,
                             bits=module.bits, mode=getattr(module, "mode", "affine")).astype(mx.float32)
    return module.weight.astype(mx.float32)


def dense_shape(module) -> tuple:
    rows, cols = module.weight.shape[0], module.weight.shape[-1]
    return (rows, module.scales.shape[-1] * module.group_size) if "scales" in module else tuple(module.weight.shape)


def fused_lora_weight(module):
    """W + scale * B^T A^T in float32 (mlx-lm's LoRALinear.fuse, without rounding the update to W's dtype)."""
    import mlx.core as mx

    a, b = module.lora_a.astype(mx.float32), module.lora_b.astype(mx.float32)
    return dense_weight(module.linear) + (module.scale * b.T) @ a.T


def to_numpy(produce, rows: int | None = None):
    import mlx.core as mx
    import numpy as np

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
    from mlx_lm.tuner.lora import LoRALinear

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
    from ..llm.gguf_export import Vocab, folder_vocab, vocab_from_gguf
    from ..llm.gguf_import import bundled_gemma_270m_gguf
    from ..llm.models import BUILTIN_PREFIX

    if spec == BUILTIN_PREFIX + "gemma-3-270m":
        return vocab_from_gguf(bundled_gemma_270m_gguf())
    if spec == BUILTIN_PREFIX + "tiny-random":
        from ..llm.tiny_model import tiny_vocab
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


def modelfile_text(gguf_name: str, system: str, example: str, source: str) -> str:
    return (f"# Ollama Modelfile for {gguf_name}, written by `wordle-mlx export` ({source}).\n"
            f"#   ollama create wordle -f {Path(gguf_name).stem}.Modelfile && ollama run wordle\n"
            f"# Each message is the board as the player was trained to read it, e.g. {example!r}.\n"
            f"FROM ./{gguf_name}\n"
            f'TEMPLATE """{OLLAMA_TEMPLATE}"""\n'
            f'SYSTEM """{system}"""\n'
            f'PARAMETER stop "{STOP_PIECE}"\n'
            "PARAMETER temperature 0\n")


def run(cfg: ExportConfig) -> dict:
    from ..fileio import atomic_path, write_text_atomic
    from ..llm.gguf_export import text_args, write_gguf
    from ..llm.models import load_model, resolve_model
    from ..llm.prompts import PromptConfig, adapter_prompt, describe_state, system_prompt
    from ..llm.reply_grammar import adapter_decoding, untrained_tags_warning
    from ..llm.tokenizer_build import GEMMA3_CHAT_TEMPLATE

    start = time.perf_counter()
    out, adapter = resolve_path(cfg, cfg.out), resolve_path(cfg, cfg.adapter)
    if out.suffix.lower() != ".gguf":
        raise UserError(f"out: {cfg.out!r} must end in .gguf")
    modelfile = out.with_suffix(".Modelfile")
    if not cfg.overwrite and (out.exists() or modelfile.exists()):
        raise UserError(f"out: {display_path(out if out.exists() else modelfile)} already exists; pass --overwrite "
                        "to replace it")
    adapter_cfg = read_adapter(adapter)
    spec = cfg.model or adapter_cfg.get("base_model") or DEFAULT_MODEL
    recorded = adapter_prompt(adapter)
    prompt = recorded or PromptConfig()
    model, tokenizer = load_model(spec, adapter_path=adapter)
    text = getattr(model, "language_model", model)
    args = text_args(model, spec)
    location = resolve_model(spec)
    if isinstance(location, str):   # a Hugging Face repo id, downloaded by mlx-lm's loader already
        from mlx_lm.utils import _download
        location = Path(_download(location))
    folder = Path(location)
    vocab = export_vocab(spec, folder)
    check_vocab(vocab, tokenizer)
    quantized = "scales" in text.model.embed_tokens
    sources = text_weight_sources(text, len(vocab.pieces))
    system = system_prompt(prompt)
    extra = {META_PROMPT: json.dumps(prompt.model_dump(), sort_keys=True), META_SYSTEM: system,
             "wordle_mlx.base_model": spec, "wordle_mlx.adapter": adapter.name}
    decode, trained_tags = adapter_decoding(adapter)
    if decode is not None:
        extra["wordle_mlx.decode"] = decode
    if trained_tags is not None:
        extra["wordle_mlx.trained_tags"] = "true" if trained_tags else "false"
    warning = untrained_tags_warning(adapter, "free")      # what llama.cpp and Ollama play
    if warning:
        print(warning, file=sys.stderr)
    if not cfg.json_output:
        console.print(f"exporting {spec} + adapter {display_path(adapter)} -> {display_path(out)} ({cfg.gguf_type}, "
                      "LoRA fused in float32"
                      + (", dequantised from the quantised base" if quantized else "") + ")")
    with atomic_path(out) as tmp:
        counts = write_gguf(tmp, args, sources, vocab, gguf_type=cfg.gguf_type,
                            chat_template=getattr(tokenizer, "chat_template", None) or GEMMA3_CHAT_TEMPLATE,
                            name=f"{adapter.name} ({spec} + LoRA)", extra=extra)
        write_text_atomic(modelfile, modelfile_text(out.name, system, describe_state([], style=prompt.style),
                                                    f"{spec} + {adapter.name}"))
    skipped = non_text_tensors(folder)
    result = {"out": display_path(out), "modelfile": display_path(modelfile), "type": cfg.gguf_type, "model": spec,
              "adapter": display_path(adapter), "tensors": counts["tensors"], "vocab": counts["vocab"],
              "tokenizer": vocab.source, "non_text_tensors_left_out": skipped, "dequantized": quantized,
              "prompt": "recorded by the adapter" if recorded else "default (the adapter records none)",
              "decode": decode, "trained_tags": trained_tags,
              "size_mb": round(out.stat().st_size / 1e6, 1), "seconds": round(time.perf_counter() - start, 1)}
    if not cfg.json_output:
        console.print(f"wrote {result['out']} ({result['size_mb']} MB, {result['tensors']} tensors, "
                      f"{result['vocab']} tokens) "
                      f"and {modelfile.name}; text weights only"
                      + (f" ({skipped} vision/projector tensors left out)" if skipped else "")
                      + f"; prompt format {result['prompt']}; tokenizer from {vocab.source}")
    return result

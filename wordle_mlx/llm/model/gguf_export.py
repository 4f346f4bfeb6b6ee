"""Write a Gemma 3 text model as a llama.cpp GGUF file: the reverse of `gguf_import`.

Tensors get llama.cpp's `gemma3` names (the inverse of `gguf_import`'s name tables) and RMSNorm weights
are written as 1 + w, since llama.cpp multiplies by the stored scale while mlx-lm adds the 1 at run
time. Hyperparameters go to `gemma3.*` metadata, the tokenizer to `tokenizer.ggml.*` (SentencePiece
pieces, scores and token types, `<bos>`/`<eos>`/`<end_of_turn>` ids, add-bos, the chat template), and
any extra strings (e.g. the adapter's prompt format) to keys of their own. Tensors are streamed: each
one is produced as float32 by a callback only when it is written, then stored as f32, f16 or q8_0
(norms and other 1-D tensors always f32, as llama.cpp's own converter does), so a 4B model never has
to sit in memory in float32 at once. The vocabulary comes from a GGUF file, a SentencePiece
`tokenizer.model`, or a Hugging Face `tokenizer.json` (scores rebuilt from the merge ranks).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, RopeScalingType
from gguf.quants import quantize

from ...errors import UserError
from .gguf_import import GLOBAL_TENSORS, LAYER_TENSORS, field_value
from .tokenizer_build import (SPACE_PIECE, TYPE_BYTE, TYPE_CONTROL, TYPE_NORMAL, TYPE_UNKNOWN,
                              TYPE_USER_DEFINED)

GGUF_TYPES = ("f32", "f16", "q8_0")
Q8_0_BLOCK = 32
LLAMA_CPP_SWA_PATTERN = 6          # llama.cpp's gemma3 assumes every 6th layer is global
MLX_LAYER_PATTERN = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")
_LAYER_TO_GGUF = {mlx: name for name, mlx in LAYER_TENSORS.items()}
_GLOBAL_TO_GGUF = {mlx: name for name, mlx in GLOBAL_TENSORS.items()}
BYTE_PIECE = re.compile(r"^<0x[0-9A-F]{2}>$")


def gguf_tensor_name(mlx_name: str) -> str | None:
    """The llama.cpp `gemma3` name of an mlx-lm `gemma3_text` weight, or None if llama.cpp has none."""
    match = MLX_LAYER_PATTERN.match(mlx_name)
    if match:
        layer, kind = match.groups()
        return f"blk.{layer}.{_LAYER_TO_GGUF[kind]}.weight" if kind in _LAYER_TO_GGUF else None
    stem = mlx_name.removesuffix(".weight")
    return f"{_GLOBAL_TO_GGUF[stem]}.weight" if stem in _GLOBAL_TO_GGUF and mlx_name.endswith(".weight") else None


@dataclass
class Vocab:
    """A SentencePiece vocabulary as GGUF stores it, and where it was read from."""
    pieces: list[str]
    scores: list[float]
    types: list[int]
    source: str

    def id_of(self, piece: str) -> int | None:
        try:
            return self.pieces.index(piece)
        except ValueError:
            return None


def vocab_from_gguf(path: str | Path) -> Vocab:
    reader = GGUFReader(path)
    return Vocab([str(p) for p in field_value(reader, "tokenizer.ggml.tokens")],
                 [float(s) for s in field_value(reader, "tokenizer.ggml.scores")],
                 [int(t) for t in field_value(reader, "tokenizer.ggml.token_type")], f"{path} (GGUF)")


def user_defined_piece(piece: str) -> str:
    """llama.cpp's converter writes user-defined pieces with real spaces ("▁▁" -> "  "); gguf_import undoes it."""
    return piece.replace(SPACE_PIECE, " ")


def special_added_ids(folder: Path) -> set[int]:
    """Ids that tokenizer_config.json marks special: llama.cpp's converter makes them CONTROL tokens."""
    try:
        decoder = json.loads((folder / "tokenizer_config.json").read_text()).get("added_tokens_decoder") or {}
    except (OSError, ValueError, AttributeError):
        return set()
    return {int(i) for i, token in decoder.items() if isinstance(token, dict) and token.get("special")}


def vocab_from_sentencepiece(path: Path) -> Vocab:
    """Pieces, scores and types straight from a SentencePiece BPE `tokenizer.model`."""
    from sentencepiece import sentencepiece_model_pb2   # needs protobuf: no direct requirement, only this path uses it

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:   # protobuf raises DecodeError, a plain Exception subclass
        raise UserError(f"{path}: not a SentencePiece model: {exc}") from None
    if proto.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.BPE:
        raise UserError(f"{path}: SentencePiece model type {proto.trainer_spec.model_type}; only BPE (Gemma) is supported")
    special = special_added_ids(path.parent)
    pieces, scores, types = [], [], []
    for i, p in enumerate(proto.pieces):
        ptype = TYPE_CONTROL if i in special and p.type == TYPE_USER_DEFINED else int(p.type)
        pieces.append(user_defined_piece(p.piece) if ptype == TYPE_USER_DEFINED else p.piece)
        scores.append(float(p.score))
        types.append(ptype)
    return Vocab(pieces, scores, types, f"{path} (SentencePiece)")


def vocab_from_tokenizer_json(path: Path) -> Vocab:
    """A SentencePiece-style vocabulary rebuilt from a BPE `tokenizer.json` (with byte fallback).

    Added special tokens become CONTROL (the unk token UNKNOWN), other added tokens USER_DEFINED,
    `<0xNN>` pieces BYTE. A piece made by merge number r scores -r, so llama.cpp's highest-score-first
    merging follows the merge ranks; pieces no merge makes score below every merged one.
    """
    try:
        data = json.loads(path.read_text())
        model = data["model"]
        vocab, merges = model["vocab"], model.get("merges") or []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a readable tokenizer.json: {exc}") from None
    if model.get("type") != "BPE":
        raise UserError(f"{path}: model.type is {model.get('type')!r}; only BPE (Gemma) tokenizers are supported")
    added = {t["id"]: t for t in data.get("added_tokens", [])}
    size = max([*vocab.values(), *added]) + 1
    pieces = [""] * size
    for piece, i in vocab.items():
        pieces[i] = piece
    for i, token in added.items():
        pieces[i] = token["content"]
    if "" in pieces:
        raise UserError(f"{path}: token ids are not contiguous (id {pieces.index('')} has no piece)")
    made_by = {}
    for rank, merge in enumerate(merges):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        made_by.setdefault(left + right, rank)
    unk = model.get("unk_token")
    scores, types = [], []
    for i, piece in enumerate(pieces):
        if i in added:
            ttype = (TYPE_UNKNOWN if piece == unk else TYPE_CONTROL) if added[i].get("special") else TYPE_USER_DEFINED
        elif piece == unk:
            ttype = TYPE_UNKNOWN
        elif model.get("byte_fallback") and BYTE_PIECE.match(piece):
            ttype = TYPE_BYTE
        else:
            ttype = TYPE_NORMAL
        types.append(ttype)
        pieces[i] = user_defined_piece(piece) if ttype == TYPE_USER_DEFINED else piece
        scores.append(-float(made_by[piece]) if piece in made_by else
                      (-float(len(merges) + i) if ttype == TYPE_NORMAL else 0.0))
    return Vocab(pieces, scores, types, f"{path} (tokenizer.json)")


def folder_vocab(folder: Path) -> Vocab:
    """The vocabulary of a Hugging Face / mlx-lm model folder: `tokenizer.model` if present, else `tokenizer.json`."""
    if (folder / "tokenizer.model").is_file():
        return vocab_from_sentencepiece(folder / "tokenizer.model")
    if (folder / "tokenizer.json").is_file():
        return vocab_from_tokenizer_json(folder / "tokenizer.json")
    raise UserError(f"model folder {folder}: no tokenizer.model or tokenizer.json to export the tokenizer from")


def text_args(model, source: str) -> dict:
    """The effective `gemma3_text` hyperparameters of a loaded mlx-lm model (text part of a `gemma3` wrapper)."""
    text = getattr(model, "language_model", model)
    args = getattr(text, "args", None)
    if getattr(args, "model_type", None) not in ("gemma3_text", "gemma3") or not dataclasses.is_dataclass(args):
        found = getattr(model, "model_type", None) or getattr(args, "model_type", None) or type(model).__name__
        raise UserError(f"model {source}: architecture {found!r} is not supported; export writes Gemma 3 "
                        "(model_type gemma3_text, or the text part of gemma3)")
    args = dataclasses.asdict(args)
    if float(args["rope_local_base_freq"]) != 10_000.0:
        raise UserError(f"model {source}: rope_local_base_freq {args['rope_local_base_freq']} is not supported "
                        "(llama.cpp's gemma3 uses 10000)")
    scaling = args.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in (None, "default", "linear"):
        raise UserError(f"model {source}: rope_scaling type {kind!r} is not supported (only linear)")
    return args


def gguf_metadata(writer, args: dict, name: str) -> None:
    """The `general.*` and `gemma3.*` keys llama.cpp reads for a Gemma 3 model."""
    writer.add_name(name)
    writer.add_context_length(int(args["max_position_embeddings"]))
    writer.add_embedding_length(int(args["hidden_size"]))
    writer.add_block_count(int(args["num_hidden_layers"]))
    writer.add_feed_forward_length(int(args["intermediate_size"]))
    writer.add_head_count(int(args["num_attention_heads"]))
    writer.add_head_count_kv(int(args["num_key_value_heads"]))
    writer.add_key_length(int(args["head_dim"]))
    writer.add_value_length(int(args["head_dim"]))
    writer.add_layer_norm_rms_eps(float(args["rms_norm_eps"]))
    writer.add_rope_freq_base(float(args["rope_theta"]))
    writer.add_sliding_window(int(args["sliding_window"]))
    if int(args["sliding_window_pattern"]) != LLAMA_CPP_SWA_PATTERN:   # gguf_import reads it; llama.cpp assumes 6
        writer.add_sliding_window_pattern(int(args["sliding_window_pattern"]))
    scaling = args.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))


def tokenizer_metadata(writer, vocab: Vocab, chat_template: str) -> None:
    """`tokenizer.ggml.*`: a SentencePiece ("llama") vocabulary, Gemma's special ids, add-bos, the chat template."""
    ids = {}
    for piece in ("<bos>", "<eos>", "<unk>", "<pad>", "<end_of_turn>"):
        ids[piece] = vocab.id_of(piece)
    for piece in ("<bos>", "<eos>", "<unk>"):
        if ids[piece] is None:
            raise UserError(f"tokenizer {vocab.source}: no {piece} piece; not a Gemma tokenizer")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab.pieces)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    writer.add_bos_token_id(ids["<bos>"])
    writer.add_eos_token_id(ids["<eos>"])
    writer.add_unk_token_id(ids["<unk>"])
    if ids["<pad>"] is not None:
        writer.add_pad_token_id(ids["<pad>"])
    if ids["<end_of_turn>"] is not None:
        writer.add_eot_token_id(ids["<end_of_turn>"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(chat_template)


def encode_tensor(values, gguf_type: str):
    """(data, raw_dtype) for one float32 tensor: 1-D tensors stay f32; matrices become `gguf_type`."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if values.ndim == 1 or gguf_type == "f32":
        return values, None
    if gguf_type == "f16":
        return values.astype(np.float16), None
    if values.shape[-1] % Q8_0_BLOCK:
        raise UserError(f"q8_0 needs rows of a multiple of {Q8_0_BLOCK} values; a tensor has {values.shape[-1]}")
    return quantize(values, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0


TensorSource = tuple[str, tuple, Callable[[], object]]   # (mlx-lm name, shape, () -> float32 numpy array)


def tensor_layout(shape: tuple, gguf_type: str):
    """(stored shape, numpy dtype, bytes, raw GGML type) of a tensor as `encode_tensor` will store it."""
    count = int(np.prod(shape))
    if len(shape) == 1 or gguf_type == "f32":
        return tuple(shape), np.float32, 4 * count, None
    if gguf_type == "f16":
        return tuple(shape), np.float16, 2 * count, None
    if shape[-1] % Q8_0_BLOCK:
        raise UserError(f"q8_0 needs rows of a multiple of {Q8_0_BLOCK} values; a tensor has {shape[-1]}")
    row_bytes = shape[-1] // Q8_0_BLOCK * (2 + Q8_0_BLOCK)
    return (*shape[:-1], row_bytes), np.uint8, count // shape[-1] * row_bytes, GGMLQuantizationType.Q8_0


def write_gguf(path: str | Path, args: dict, tensors: Iterable[TensorSource], vocab: Vocab, *,
               gguf_type: str = "f32", chat_template: str, name: str, extra: dict[str, str] | None = None) -> dict:
    """Write the GGUF file at `path` (the caller makes it atomic); returns counts for the report.

    `tensors` yields (mlx name, shape, producer); each producer is called once, when its tensor is written.
    """
    if gguf_type not in GGUF_TYPES:
        raise UserError(f"type: {gguf_type!r} is not one of {', '.join(GGUF_TYPES)}")
    named = []
    for mlx_name, shape, produce in tensors:
        target = gguf_tensor_name(mlx_name)
        if target is None:
            raise UserError(f"weight {mlx_name!r} has no llama.cpp gemma3 tensor; unsupported architecture")
        named.append((target, tuple(int(n) for n in shape), mlx_name.endswith("norm.weight"), produce))
    writer = gguf.GGUFWriter(str(path), "gemma3")
    try:
        write_contents(writer, Path(path), args, named, vocab, gguf_type, chat_template, name, extra or {})
    finally:
        writer.close()
    return {"tensors": len(named), "vocab": len(vocab.pieces)}


def write_contents(writer, path: Path, args: dict, named: list, vocab: Vocab, gguf_type: str, chat_template: str,
                   name: str, extra: dict[str, str]) -> None:
    gguf_metadata(writer, args, name)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[gguf_type]
    writer.add_file_type(int(file_type))
    if gguf_type == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokenizer_metadata(writer, vocab, chat_template)
    for key, value in extra.items():
        writer.add_string(key, value)
    for target, shape, _, _ in named:
        stored, dtype, nbytes, raw = tensor_layout(shape, gguf_type)
        writer.add_tensor_info(target, stored, np.dtype(dtype), nbytes, raw_dtype=raw)
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for target, shape, is_norm, produce in named:
        values = np.asarray(produce(), dtype=np.float32)
        if values.shape != shape:
            raise UserError(f"tensor {target}: produced shape {values.shape}, expected {shape}")
        writer.write_tensor_data(encode_tensor(values + 1.0 if is_norm else values, gguf_type)[0])

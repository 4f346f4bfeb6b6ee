"""Build Hugging Face `tokenizer.json` + `tokenizer_config.json` files for Gemma-style tokenizers.

Gemma uses a SentencePiece BPE vocabulary with byte fallback, no dummy prefix, spaces written as
"▁", control tokens (`<pad>`, `<eos>`, `<bos>`, `<unk>`, `<start_of_turn>`, `<end_of_turn>`, ...) and a
`<bos>` in front of every encoded text. `gemma_tokenizer_json` turns a piece list (pieces, scores,
SentencePiece token types, e.g. read from a GGUF file's `tokenizer.ggml.*` arrays) into a `tokenizers`
BPE whose merges are ranked by piece score, which reproduces SentencePiece's highest-score-first
merging. `write_tokenizer_files` writes both files with Gemma 3's chat template, so the folder loads
with `transformers.AutoTokenizer` and `mlx_lm.load`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ...storage.fileio import write_json_atomic

# SentencePiece / GGUF token types (gguf.TokenType).
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6

SPACE_PIECE = "\u2581"

# Gemma 3's official chat template: a system message is prepended to the first user turn.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    "{{ raise_exception('Invalid content type') }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def sentencepiece_merges(pieces: Sequence[str], scores: Sequence[float], mergeable: Sequence[bool]) -> list[list[str]]:
    """BPE merges for a SentencePiece BPE vocabulary, best (highest score) first.

    Every mergeable piece of two or more characters yields one merge per way of splitting it into two
    mergeable pieces; ties keep the left-longest split first, as transformers' converter does.
    """
    index = {p: i for i, p in enumerate(pieces) if mergeable[i]}
    ranked = []
    for piece, pid in index.items():
        if len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                ranked.append((-scores[pid], pid, index[left], index[right], left, right))
    ranked.sort()
    return [[left, right] for *_, left, right in ranked]


def gemma_tokenizer_json(pieces: Sequence[str], scores: Sequence[float], token_types: Sequence[int],
                         bos_token: str = "<bos>", unk_token: str = "<unk>") -> dict:
    """The `tokenizer.json` object for a Gemma-style SentencePiece BPE vocabulary with byte fallback.

    Control, unknown and user-defined pieces become added tokens (so they are matched whole in the
    text); control/unknown ones are marked special.
    """
    if len(pieces) != len(scores) or len(pieces) != len(token_types):
        raise ValueError(f"tokenizer arrays differ in length: {len(pieces)} pieces, {len(scores)} scores, "
                         f"{len(token_types)} types")
    # llama.cpp's GGUF converter writes spaces in user-defined pieces ("▁▁" -> "  "); undo that so the
    # pieces match the space-escaped text the way SentencePiece matches them.
    pieces = [p.replace(" ", SPACE_PIECE) if t == TYPE_USER_DEFINED else p for p, t in zip(pieces, token_types)]
    duplicates = len(pieces) - len(set(pieces))
    if duplicates:
        raise ValueError(f"tokenizer vocabulary has {duplicates} duplicate pieces")
    vocab = {piece: i for i, piece in enumerate(pieces)}
    for name in (bos_token, unk_token):
        if name not in vocab:
            raise ValueError(f"tokenizer vocabulary has no {name}")
    mergeable = [t in (TYPE_NORMAL, TYPE_USER_DEFINED) for t in token_types]
    added = []
    for i, (piece, ttype) in enumerate(zip(pieces, token_types)):
        whole = ttype in (TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED)
        if whole:
            # User-defined pieces are matched in the normalized (space-escaped) text, as SentencePiece does.
            added.append({"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": ttype == TYPE_USER_DEFINED,
                          "special": ttype in (TYPE_CONTROL, TYPE_UNKNOWN)})
    bos_id = vocab[bos_token]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_PIECE},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos_token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos_token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos_token, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos_token: {"id": bos_token, "ids": [bos_id], "tokens": [bos_token]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE_PIECE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk_token,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": sentencepiece_merges(pieces, scores, mergeable),
        },
    }


def write_tokenizer_files(out_dir: str | Path, tokenizer_json: dict, *, bos_token: str = "<bos>",
                          eos_token: str = "<eos>", pad_token: str = "<pad>", unk_token: str = "<unk>",
                          chat_template: str = GEMMA3_CHAT_TEMPLATE, model_max_length: int = 32768) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json` (with the chat template) into `out_dir`."""
    out_dir = Path(out_dir)
    write_json_atomic(out_dir / "tokenizer.json", tokenizer_json)
    write_json_atomic(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos_token,
        "eos_token": eos_token,
        "pad_token": pad_token,
        "unk_token": unk_token,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "chat_template": chat_template,
    })


def tokenizer_summary(tokenizer_json: dict) -> dict:
    """A few counts for logs: vocabulary size, merges, added and special tokens."""
    added = tokenizer_json.get("added_tokens", [])
    return {"vocab": len(tokenizer_json["model"]["vocab"]), "merges": len(tokenizer_json["model"]["merges"]),
            "added": len(added), "special": sum(1 for t in added if t["special"])}

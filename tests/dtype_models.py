"""The tiny random model in the Mac dtypes, for the bf16 and 4-bit tests: a bfloat16 copy and a 4-bit copy
made by mlx-lm's own converter (`mlx_lm.convert`, as `mlx-community/*-4bit` repos are made), each built once
per process in a temporary folder; and GRPO items sampled from a model by the real generator."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_built: dict[str, Path] = {}


def tiny_model_in(kind: str) -> str:
    """A model folder of `builtin:tiny-random` saved as "bfloat16" or quantized to "4bit" (mlx-lm's default group size 64)."""
    if kind not in _built:
        from mlx_lm.convert import convert

        from wordle_mlx.llm.models import tiny_random_dir

        root = Path(tempfile.mkdtemp(prefix="wordle-mlx-dtypes-"))
        atexit.register(shutil.rmtree, root, True)
        out = root / kind
        if kind == "bfloat16":
            convert(str(tiny_random_dir()), str(out), dtype="bfloat16")
        elif kind == "4bit":
            convert(str(tiny_random_dir()), str(out), quantize=True, q_bits=4, dtype="bfloat16")
        else:
            raise ValueError(f"unknown kind {kind!r}")
        _built[kind] = out
    return str(_built[kind])


def sampled_items(model, tokenizer, groups: int = 2, g: int = 4) -> list:
    """G replies sampled (temperature 1, the real generator) to each of `groups` prompts, as GRPO items with
    the sampler's log-probs; rewards 0, 1, ..., G - 1 within a group, so every group trains."""
    from wordle_mlx.llm.episode import TokenSequence
    from wordle_mlx.llm.generation import BatchedGenerator, SamplingConfig
    from wordle_mlx.llm.grpo_step import ScoredItem

    items = []
    generate = BatchedGenerator(model, tokenizer)
    for group in range(groups):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"guess {group}"}],
                                               add_generation_prompt=True)
        for i, c in enumerate(generate([prompt] * g, SamplingConfig(temperature=1.0, max_tokens_per_turn=6,
                                                                    seed=group))):
            seq = TokenSequence(list(prompt) + c.tokens, [0] * len(prompt) + [1] * len(c.tokens),
                                [0.0] * len(prompt) + c.logprobs)
            items.append(ScoredItem([seq], group, float(i), {}))
    return items

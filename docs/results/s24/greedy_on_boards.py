"""Session 24 diagnostic: unconstrained greedy replies of adapters on the boards of an SFT data file.

For the first N distinct prompts of DATA/{split}.jsonl, each adapter decodes one greedy reply (16 tokens);
prints, per adapter, the share of replies that are allowed words, and the share equal to the record's label.
Tells whether training on those boards taught the model to spell on them (memorized) apart from held-out play.
Usage: .venv/bin/python docs/results/s24/greedy_on_boards.py DATA SPLIT N ADAPTER [ADAPTER ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from wordle_mlx.blas import reexec_with_openblas  # noqa: E402


def distinct_records(path: Path, n: int, skip_text: str | None = None) -> list[dict]:
    """The first `n` records of an SFT JSONL file with distinct prompts, leaving out prompts that contain
    `skip_text`."""
    from wordle_mlx.stages.data import read_sft_jsonl

    records, seen = [], set()
    for r in read_sft_jsonl(path):
        key = json.dumps(r["messages"][:-1], sort_keys=True)
        if key not in seen and not (skip_text and skip_text in key):
            seen.add(key)
            records.append(r)
    return records[:n]


def load_adapter(adapter: str):
    """(model, tokenizer) of the adapter's base model with the adapter applied."""
    from wordle_mlx.llm.models import load_model

    cfg = json.loads((Path(adapter) / "adapter_config.json").read_text())
    return load_model(cfg.get("base_model", "builtin:gemma-3-270m"), adapter_path=adapter)


def main() -> None:
    reexec_with_openblas()
    from wordle_mlx.game.words import guess_list
    from wordle_mlx.llm.generation import BatchedGenerator, SamplingConfig
    from wordle_mlx.llm.prompts import parse_reply

    data, split, n, adapters = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    records = distinct_records(data / f"{split}.jsonl", n)
    allowed = frozenset(guess_list())
    for adapter in adapters:
        model, tok = load_adapter(adapter)
        prompts = [tok.apply_chat_template(r["messages"][:-1], add_generation_prompt=True) for r in records]
        gen, sampling = BatchedGenerator(model, tok), SamplingConfig(temperature=0.0, max_tokens_per_turn=16)
        replies = [c for i in range(0, len(prompts), 64) for c in gen(prompts[i:i + 64], sampling)]
        parsed = [parse_reply(c.text, False, allowed) for c in replies]
        words = sum(p.error is None for p in parsed)
        same = sum(p.guess == r["meta"]["target"] for p, r in zip(parsed, records))
        print(f"{adapter}: {len(records)} boards of {data}/{split}: allowed words {words / len(records):.3f}, "
              f"equal to the label {same / len(records):.3f}", flush=True)


if __name__ == "__main__":
    main()

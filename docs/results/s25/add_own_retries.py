"""Session 25: add retry examples from the model's own greedy non-words to an existing choice data folder.

Does what `wordle-mlx choice` does with `own_retries` (`stages/choice.own_retry_records`), on a folder that
`choice` already wrote, so the boards and labels stay those of that round (the labelling and the 14-minute
self-play are not redone). Writes OUT/{train,valid}.jsonl and OUT/stats.json after `data`'s replay check.
Usage: .venv/bin/python docs/results/s25/add_own_retries.py ADAPTER DATA OUT ROUNDS
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from wordle_mlx.blas import reexec_with_openblas  # noqa: E402


def main() -> None:
    reexec_with_openblas()
    from wordle_mlx.game.splits import split_answers
    from wordle_mlx.game.words import answers, guess_list
    from wordle_mlx.llm.models import load_model
    from wordle_mlx.llm.prompts import PromptConfig
    from wordle_mlx.stages.choice import own_retry_records
    from wordle_mlx.stages.data import read_sft_jsonl, write_checked_sft

    adapter, data_dir, out, rounds = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    stats = json.loads((data_dir / "stats.json").read_text())
    prompt = PromptConfig(**stats["prompt"])
    cfg = json.loads((Path(adapter) / "adapter_config.json").read_text())
    model, tok = load_model(cfg.get("base_model", "builtin:gemma-3-270m"), adapter_path=adapter)
    model.eval()
    allowed = frozenset(guess_list())
    data = {}
    for split in ("train", "valid"):
        t0 = time.monotonic()
        records = read_sft_jsonl(data_dir / f"{split}.jsonl")
        retries, counts = own_retry_records(records, model, tok, prompt, allowed, rounds)
        data[split] = records + retries
        random.Random(f"wordle-mlx-own-retries|{split}").shuffle(data[split])
        stats[split]["own_retries"] = {**counts, "seconds": round(time.monotonic() - t0, 1)}
        stats[split]["records"] = len(data[split])
        print(split, len(records), "->", len(data[split]), json.dumps(stats[split]["own_retries"]), flush=True)
    stats["own_retries_from"] = {"data": str(data_dir), "adapter": adapter, "rounds": rounds}
    splits = {name: set(words) for name, words in split_answers(answers()).items()}
    write_checked_sft(out, data, stats, prompt, set(allowed), splits)


if __name__ == "__main__":
    main()

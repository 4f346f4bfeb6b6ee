"""Session 24 diagnostic: relabel a letters-format SFT data folder with the model's own constrained greedy
reply. For each record's prompt, the adapter decodes greedily with the allowed-words constraint
(`--constrain`: every letter must continue one of the 12,972 allowed guesses, never the answer list); the
record's reply becomes that word. Trained with `letter_targets: "allowed"`, these labels ask the model only
to keep its own greedy path on real words: at each letter, the mass off the allowed-word trie moves onto
the letters that stay on it, in proportion to what the model already gives them.

Usage: .venv/bin/python docs/results/s24/relabel_constrained.py ADAPTER IN_DIR OUT_DIR
Writes OUT_DIR/{train,valid}.jsonl and stats.json (the input's, plus a `relabel` block), each through a
temp file and a rename.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from wordle_mlx.blas import reexec_with_openblas  # noqa: E402


def main() -> None:
    reexec_with_openblas()
    from wordle_mlx.fileio import write_json_atomic
    from wordle_mlx.game.words import guess_list
    from wordle_mlx.llm.generation import BatchedGenerator, SamplingConfig
    from wordle_mlx.llm.models import load_model
    from wordle_mlx.llm.prompts import format_reply, parse_reply
    from wordle_mlx.stages.data import read_sft_jsonl

    adapter, src, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    model, tok = load_model(cfg.get("base_model", "builtin:gemma-3-270m"), adapter_path=adapter)
    allowed = frozenset(guess_list())
    gen = BatchedGenerator(model, tok, constraint_words=allowed)
    sampling = SamplingConfig(temperature=0.0, max_tokens_per_turn=16)
    out.mkdir(parents=True, exist_ok=True)
    stats = json.loads((src / "stats.json").read_text())
    report = {"adapter": str(adapter), "source": str(src)}
    for split in ("train", "valid"):
        records = read_sft_jsonl(src / f"{split}.jsonl")
        keys = [json.dumps(r["messages"][:-1], sort_keys=True) for r in records]
        distinct = list(dict.fromkeys(keys))
        prompts = [tok.apply_chat_template(json.loads(k), add_generation_prompt=True) for k in distinct]
        start, labels = time.time(), {}
        for i in range(0, len(prompts), 64):
            for k, c in zip(distinct[i:i + 64], gen(prompts[i:i + 64], sampling)):
                parsed = parse_reply(c.text, False, allowed)
                if parsed.guess is None or parsed.error is not None:
                    raise SystemExit(f"{src}/{split}.jsonl: constrained reply {c.text!r} is not an allowed guess")
                labels[k] = parsed.guess
            print(f"{split}: {min(i + 64, len(prompts))}/{len(prompts)} prompts, {time.time() - start:.0f} s", flush=True)
        same = 0
        tmp = out / f".{split}.jsonl.tmp"
        with tmp.open("w") as f:
            for r, k in zip(records, keys):
                word = labels[k]
                same += word == r["meta"].get("target")
                meta = dict(r["meta"], target=word, mode="constrained_greedy", label_before=r["meta"].get("target"))
                msgs = r["messages"][:-1] + [{"role": "assistant", "content": format_reply(None, word, guess_format="letters")}]
                f.write(json.dumps({"messages": msgs, "meta": meta}) + "\n")
        tmp.replace(out / f"{split}.jsonl")
        report[split] = {"records": len(records), "distinct_prompts": len(distinct), "same_as_before": same,
                         "seconds": round(time.time() - start, 1)}
        print(split, report[split], flush=True)
    stats["relabel"] = report
    write_json_atomic(out / "stats.json", stats)


if __name__ == "__main__":
    main()

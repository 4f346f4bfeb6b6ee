"""Rewrite a data folder's "XXXXX is not in the word list." messages as "Not in the word list: x x x x x."

Session 26's question: the model repeats its rejected non-word after "BOIND is not in the word list. Try again."
In that message the word is one or two upper-case tokens, while the model's own reply spells it as five
single-letter tokens (" b o i n d"). Shown the same five tokens, not repeating them is a copy-suppression the
model could learn by looking at its prompt. This rewrites every not-a-word message of a train/valid folder,
copies everything else unchanged, and sets prompt.rejected_word = "letters" in stats.json (the `sft` stage writes
that into the adapter, so eval and play show the adapter the same message; `data` and `choice` write the same
text with that prompt setting):  python letters_messages.py SRC_DIR DST_DIR
"""
import json
import re
import sys
from pathlib import Path

PATTERN = re.compile(r"^([A-Z]{5}) is not in the word list\.")


def letters_message(word: str) -> str:
    return f"Not in the word list: {' '.join(word.lower())}."


def rewrite(text: str) -> tuple[str, bool]:
    m = PATTERN.match(text)
    if not m:
        return text, False
    return letters_message(m.group(1)) + text[m.end():], True


def main(src: str, dst: str) -> None:
    src_dir, dst_dir = Path(src), Path(dst)
    dst_dir.mkdir(parents=True, exist_ok=False)
    for name in ("train.jsonl", "valid.jsonl"):
        changed = total = 0
        with open(src_dir / name) as fin, open(dst_dir / name, "w") as fout:
            for line in fin:
                record = json.loads(line)
                for message in record["messages"]:
                    if message["role"] == "user":
                        message["content"], hit = rewrite(message["content"])
                        changed += hit
                total += 1
                fout.write(json.dumps(record) + "\n")
        print(f"{name}: {total} records, {changed} messages rewritten")
    stats = json.loads((src_dir / "stats.json").read_text())
    stats["prompt"]["rejected_word"] = "letters"   # what `sft` writes into the adapter's prompt settings
    stats["rejected_word_from"] = str(src_dir)
    (dst_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])

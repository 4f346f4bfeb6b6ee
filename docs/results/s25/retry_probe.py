"""Session 25 diagnostic: what a player does after it is told its reply is not a word.

For the first N distinct prompts of DATA/{split}.jsonl (compact prompts), each adapter decodes one greedy
reply; for every non-word reply, the prompt the game shows next ("XXXXX is not in the word list. Try
again." above the same clues) is decoded greedily, and once more after a second non-word. Prints, per
adapter: the first-try word rate, and for the retries how often the reply repeats the rejected word, is
another non-word, or is an allowed word (and whether that word fits the clues).
With MESSAGE=letters in the environment the rejected word is shown spelled as replies spell it
("r i n e s is not in the word list."), with MESSAGE=upper as "R I N E S", with MESSAGE=rejected_letters as
`prompt.rejected_word: "letters"` shows it (session 26: "Not in the word list: r i n e s."); by default as the
game shows it to the shipped adapter.
Usage: .venv/bin/python docs/results/s25/retry_probe.py DATA SPLIT N ADAPTER [ADAPTER ...]
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "results" / "s24"))   # greedy_on_boards: the shared helpers

from wordle_mlx.blas import reexec_with_openblas  # noqa: E402


def main() -> None:
    reexec_with_openblas()
    from greedy_on_boards import distinct_records, load_adapter
    from wordle_mlx.game.feedback import feedback
    from wordle_mlx.game.words import guess_list
    from wordle_mlx.llm.generation import BatchedGenerator, SamplingConfig
    from wordle_mlx.llm.prompts import NOT_A_WORD, error_message, parse_reply

    data, split, n, adapters = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    records = distinct_records(data / f"{split}.jsonl", n, skip_text="not in the word list")
    allowed = frozenset(guess_list())
    for adapter in adapters:
        model, tok = load_adapter(adapter)
        gen, sampling = BatchedGenerator(model, tok), SamplingConfig(temperature=0.0, max_tokens_per_turn=16)

        def decode(message_lists):
            prompts = [tok.apply_chat_template(m, add_generation_prompt=True) for m in message_lists]
            replies = [c for i in range(0, len(prompts), 64) for c in gen(prompts[i:i + 64], sampling)]
            return [parse_reply(c.text, False, allowed) for c in replies]

        def fits(r, word):
            hist = r["meta"]["history"]
            return all(feedback(g, word) == feedback(g, r["meta"]["secret"]) for g in hist)

        msgs = [r["messages"][:-1] for r in records]
        first = decode(msgs)
        line = f"{adapter}: {len(records)} boards, first try an allowed word {sum(p.error is None for p in first)}"
        pending = [(i, p.guess) for i, p in enumerate(first) if p.error == NOT_A_WORD]
        for attempt in (2, 3):
            retry_msgs = []
            for i, bad in pending:
                m = [dict(x) for x in msgs[i]]
                style = os.environ.get("MESSAGE", "game")
                shown = {"letters": " ".join(bad), "upper": " ".join(bad.upper())}.get(style)
                text = error_message(NOT_A_WORD, bad) if shown is None else f"{shown} is not in the word list."
                if style == "rejected_letters":
                    text = error_message(NOT_A_WORD, bad, "letters")
                m[-1]["content"] = f"{text} Try again.\n{m[-1]['content']}"
                retry_msgs.append(m)
            out = decode(retry_msgs) if retry_msgs else []
            c = Counter()
            nxt = []
            for (i, bad), p in zip(pending, out):
                if p.error is None:
                    c["word, fits" if fits(records[i], p.guess) else "word, does not fit"] += 1
                elif p.guess == bad:
                    c["same non-word"] += 1
                    nxt.append((i, p.guess))
                elif p.error == NOT_A_WORD:
                    c["other non-word"] += 1
                    nxt.append((i, p.guess))
                else:
                    c[f"error {p.error}"] += 1
            line += f"\n  try {attempt} after a non-word ({len(pending)} boards): {dict(c)}"
            pending = nxt
        print(line, flush=True)


if __name__ == "__main__":
    main()

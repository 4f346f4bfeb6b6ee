"""What rehearsing the 4B recipe on random checkpoints needs besides the checkpoints (`mac_layouts.py`).

`recipe_config(name, **changes)` reads a config/gemma3-4b/ file with dotted-key changes (the model path, the
output folders, smaller sizes). `first_reply_a_word(sampler_class)` wraps the sampler so that the first reply
to each distinct prompt is `<guess> c r a n e</guess>` (another word where crane is on the board): a random
model never spells a word, so every reply to a board would score alike and GRPO would skip every group; with
one well-formed reply per board, the real update runs on the real layout (its old log-probs are the trainer's
own forward, not the sampler's). Used by tests/test_mac_rehearsal.py (tiny checkpoints) and
benchmarks/gemma3_4b_size.py (full size).
"""

from __future__ import annotations

import json
from pathlib import Path

from wordle_mlx.llm.play.generation import Completion
from wordle_mlx.llm.play.reply_grammar import LETTERS

RECIPE_4B = Path(__file__).resolve().parents[2] / "config" / "gemma3-4b"
WORDS = ("crane", "sloth", "pudgy", "fizzy", "mount", "wreck")   # allowed guesses, tried in this order


def recipe_config(name: str, **changes) -> dict:
    """config/gemma3-4b/`name` as a dict, with dotted-key changes applied ("rl.num_generations": 2)."""
    data = json.loads((RECIPE_4B / name).read_text())
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return data


def first_reply_a_word(base):
    """A subclass of the sampler `base` whose first reply to each distinct prompt is a well-formed guess:
    `<guess> c r a n e</guess>`, or the next of WORDS not already on that board."""
    class FirstReplyAWord(base):
        def __call__(self, prompts, cfg, *args, excluded=None, **kwargs):
            out = super().__call__(prompts, cfg, *args, excluded=excluded, **kwargs)
            seen = set()
            for i, prompt in enumerate(prompts):
                if tuple(prompt) not in seen:
                    seen.add(tuple(prompt))
                    board = set(excluded[i]) if excluded is not None else set()
                    word = next(w for w in WORDS if w not in board)     # words decoding never repeats a guess
                    text = f"<guess> {' '.join(word)}</guess>"
                    tokens, choice = self.tokenizer.encode(text, add_special_tokens=False), None
                    if self.grammar is not None:   # grammar decoding: the same reply, its letters marked as choices
                        tokens, choice = self.grammar.reply([LETTERS.index(c) for c in word])
                    out[i] = Completion(tokens, [0.0] * len(tokens), text, "stop", choice)
            return out

    return FirstReplyAWord

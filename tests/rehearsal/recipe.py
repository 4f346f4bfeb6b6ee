"""What rehearsing the 4B recipe on random checkpoints needs besides the checkpoints (`mac_layouts.py`).

`recipe_config(stage, variant, **changes)` is the config the recipe runner builds for a stage of the 4B chain
(`wordle-mlx recipe --model mlx-community/gemma-3-4b-it-<variant> --dtype bfloat16`, planned for the Mac of its
variant: 24 GB for bf16, 16 GB for 4-bit), as the fields the chain sets, without its paths (the caller gives
the model path, the output folders, smaller sizes). `first_reply_a_word(sampler_class)` wraps the sampler so
that the first reply to each distinct prompt is `<guess> c r a n e</guess>` (another word where crane is on the
board): a random model never spells a word, so every reply to a board would score alike and GRPO would skip every
group; with one well-formed reply per board, the real update runs on the real layout (its old log-probs are the
trainer's own forward, not the sampler's). Used by tests/test_mac_rehearsal.py (tiny checkpoints) and
benchmarks/gemma3_4b_size.py (full size).
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

from wordle_mlx.llm.play.generation import Completion
from wordle_mlx.llm.play.reply_grammar import LETTERS

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "config" / "recipe.json"
MAC_GB = {"bf16": 24, "4bit": 16}               # the Mac each variant is for
WORDS = ("crane", "sloth", "pudgy", "fizzy", "mount", "wreck")   # allowed guesses, tried in this order


@functools.lru_cache(maxsize=None)
def chain_4b(variant: str) -> dict:
    """{stage name: Stage} of the recipe for mlx-community/gemma-3-4b-it-<variant>, as a Mac of its memory runs
    it (bfloat16), built in an empty folder without the model on disk (its known sizes)."""
    from wordle_mlx.stages.recipe import build_stages

    before = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            _, stages = build_stages(str(RECIPE), f"mlx-community/gemma-3-4b-it-{variant}", "bfloat16",
                                     MAC_GB[variant], ship_exists=False)
        finally:
            os.chdir(before)
    return {stage.name: stage for stage in stages}


def recipe_config(stage: str, variant: str = "bf16", **changes) -> dict:
    """The fields the runner sets in stage `stage` of the 4B chain (`variant` bf16 or 4bit), without the ones
    that hold paths, with dotted-key changes applied ("rl.num_generations": 2). `eval` is the chain's eval of a
    fused model (the model, the dtype, the chain's prompt, 16 tokens a reply) without its model folder and the
    decoding it sets, so an adapter given plays the decoding it records."""
    from wordle_mlx.stages.recipe_build import PATH_FIELDS

    name = "eval-fused-greedy" if stage == "eval" else stage
    built = chain_4b(variant)[name]
    data = built.config.model_dump(mode="json", exclude_unset=True)
    for dotted in PATH_FIELDS.get(built.kind, ()):
        node, *rest = dotted.split(".")
        (data.get(node, {}) if rest else data).pop(rest[0] if rest else node, None)
    if stage == "eval":
        data["model"] = f"mlx-community/gemma-3-4b-it-{variant}"
        data["rollout"].pop("decode", None)
        for key in ("games", "baselines"):
            data.pop(key, None)
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

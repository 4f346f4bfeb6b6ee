"""Where one grammar-decoding call spends its time: the shared start, the boards' prefill, the letter steps.

The shipped adapter replies greedily to 64 letters-format boards (test words, 0-2 earlier guesses, as
`decode_roofline.py`) in one `BatchedGenerator` call in grammar decoding. The call's parts are timed by wrapping
the decoder's two model calls (each evaluated before its clock stops): `body_hidden` (the shared start once, then
each group of board remainders) and `_step` (one letter position for every row); the rest of the call (masks,
picks, buffers, Python) is what is left. Prints each part's seconds and share, then the prompt tokens run and
the padded slots their groups ran; last line `prefill_share X.XX`.
Usage: python benchmarks/decode_profile.py [--adapter adapters/gemma-3-270m-wordle] [--batch 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


def main() -> None:
    reexec_for_linux_cpu()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:gemma-3-270m")
    ap.add_argument("--adapter", default=str(ROOT / "adapters" / "gemma-3-270m-wordle"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import mlx.core as mx

    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.state import GameState
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.play import letter_decoder
    from wordle_mlx.llm.play.generation import BatchedGenerator, SamplingConfig
    from wordle_mlx.llm.play.rollout import RolloutConfig, prompt_token_ids

    model, tokenizer = load_model(args.model, adapter_path=args.adapter)
    model.eval()
    cfg = RolloutConfig().for_adapter(args.adapter)
    openers = ["raise", "clout", "denim", "pygmy"]
    prompts = [prompt_token_ids(tokenizer, cfg, GameState(w, [o for o in openers[:i % 3] if o != w]))
               for i, w in enumerate(split_words("test")[:args.batch])]
    parts = {"prefill": 0.0, "letter steps": 0.0}
    slots = [0]
    body_hidden, step = letter_decoder.body_hidden, letter_decoder._step

    def timed_prefill(model_, inputs, *a, **k):
        start = time.perf_counter()
        out = body_hidden(model_, inputs, *a, **k)
        mx.eval(out)
        parts["prefill"] += time.perf_counter() - start
        slots[0] += inputs.size
        return out

    def timed_step(*a, **k):
        start = time.perf_counter()
        out = step(*a, **k)
        mx.eval(out)
        parts["letter steps"] += time.perf_counter() - start
        return out

    letter_decoder.body_hidden, letter_decoder._step = timed_prefill, timed_step
    generate = BatchedGenerator(model, tokenizer, mode="grammar")
    greedy = SamplingConfig(completion_batch_size=args.batch)
    generate(prompts[:2], greedy)                      # first-call costs out of the way
    total = 0.0
    for _ in range(args.repeats):
        for k in parts:
            parts[k] = 0.0
        slots[0] = 0
        before = generate.prefilled_tokens
        start = time.perf_counter()
        generate(prompts, greedy)
        total = time.perf_counter() - start
        ran = generate.prefilled_tokens - before
    print(f"{args.batch} boards, one grammar-decoding call: {total:.2f} s")
    for name, s in list(parts.items()) + [("the rest (masks, picks, buffers, Python)", total - sum(parts.values()))]:
        print(f"  {name:42s} {s:6.2f} s  {s / total:5.1%}")
    print(f"prompt tokens run {ran}, in {slots[0]} slots with the groups' padding")
    print(f"prefill_share {parts['prefill'] / total:.2f}")


if __name__ == "__main__":
    main()

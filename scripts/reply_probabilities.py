"""Per-token probabilities of the teacher's reply on one board: where an SFT model's imitation breaks.

Builds the board from `--secret` and `--history` (earlier guesses; their feedback is computed), renders
the prompt the adapter was trained with (`adapter_config.json` -> `wordle_prompt`), takes the teacher's
reply for that board (the data stage's teacher: the best-splitting candidate), and prints, for every
reply token, the model's probability of it under teacher forcing and its own top choice there.

    python3 scripts/reply_probabilities.py --adapter adapters/gemma-3-270m-wordle --secret botch --history raise

With `--second-boards SPLIT` instead of a secret, it does this for every distinct board after the
teacher's opener over the secrets of SPLIT and prints, per letter position, how often the model's top
choice is the teacher's letter (teacher forcing: the earlier letters are the teacher's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", type=Path, help="LoRA adapter folder (omit for the base model)")
    ap.add_argument("--model", default="builtin:gemma-3-270m")
    ap.add_argument("--secret")
    ap.add_argument("--second-boards", choices=("train", "valid", "test"), help="summary over the boards after the opener")
    ap.add_argument("--history", default="", help="earlier guesses, comma-separated (e.g. raise,mulch)")
    args = ap.parse_args()

    from wordle_mlx.blas import reexec_with_openblas
    reexec_with_openblas()
    import mlx.core as mx
    from mlx_lm import load

    from wordle_mlx.errors import UserError
    from wordle_mlx.game.feedback import feedback
    from wordle_mlx.game.solver import Solver
    from wordle_mlx.llm.models import resolve_model
    from wordle_mlx.llm.prompts import PromptConfig, adapter_prompt, build_messages, format_reply
    from wordle_mlx.stages.data import teacher_guess
    from wordle_mlx.stages.entropy import load_table
    from wordle_mlx.stages.sft import tokenize

    solver = Solver(load_table(show_progress=False))
    model, tokenizer = load(str(resolve_model(args.model)),
                            adapter_path=str(args.adapter) if args.adapter else None)
    try:
        prompt = adapter_prompt(args.adapter) or PromptConfig()
    except UserError as exc:
        sys.exit(f"error: {exc}")

    def reply_logprobs(history):
        """(tokens, offset, log-probabilities) of the teacher's reply on this board, teacher-forced."""
        target = teacher_guess(solver, solver.candidate_columns(history), 100000)
        messages = build_messages(prompt, history)
        messages.append({"role": "assistant", "content": format_reply(None, target, guess_format=prompt.guess_format)})
        (tokens, offset), = tokenize([{"messages": messages}], tokenizer, Path("board"))
        logits = model(mx.array([tokens]))[0].astype(mx.float32)
        return messages, tokens, offset, logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    if args.second_boards:
        from wordle_mlx.game.splits import split_answers
        if prompt.guess_format != "letters":
            sys.exit("error: --second-boards needs an adapter trained on letters replies (guess_format letters)")
        opener = teacher_guess(solver, solver.candidate_columns([]), 100000)
        boards = {feedback(opener, s) for s in split_answers(solver.table.answers)[args.second_boards]}
        hits, probs = [0] * 5, [0.0] * 5
        for pattern in sorted(boards):
            _, tokens, offset, logp = reply_logprobs([(opener, pattern)])
            top = mx.argmax(logp, axis=-1)
            letters = [i for i in range(offset, len(tokens)) if len(tokenizer.decode([tokens[i]]).strip()) == 1
                       and tokenizer.decode([tokens[i]]).strip().isalpha()][:5]
            for k, i in enumerate(letters):
                hits[k] += int(top[i - 1].item() == tokens[i])
                probs[k] += mx.exp(logp[i - 1, tokens[i]]).item()
        n = len(boards)
        print(f"{n} distinct boards after the opener {opener!r} ({args.second_boards} secrets), teacher-forced:")
        for k in range(5):
            print(f"  letter {k + 1}: model's top choice is the teacher's on {hits[k]}/{n} ({100 * hits[k] / n:.0f}%), "
                  f"mean p {probs[k] / n:.2f}")
        return
    if not args.secret:
        sys.exit("error: give --secret (with --history) or --second-boards SPLIT")
    guesses = [g.strip().lower() for g in args.history.split(",") if g.strip()]
    for word in [args.secret, *guesses]:
        if word not in solver.table.guess_index:
            sys.exit(f"error: {word!r} is not an allowed guess")
    if args.secret not in solver.table.answer_index:
        sys.exit(f"error: --secret {args.secret!r} is not in the answer list")
    history = [(g, feedback(g, args.secret)) for g in guesses]
    messages, tokens, offset, logp = reply_logprobs(history)
    print(messages[1]["content"])
    print(f"teacher's reply: {messages[-1]['content']}")
    for i in range(offset, len(tokens)):
        p = mx.exp(logp[i - 1, tokens[i]]).item()
        top = int(mx.argmax(logp[i - 1]).item())
        mark = "" if top == tokens[i] else f"   model's top: {tokenizer.decode([top])!r} ({mx.exp(logp[i - 1, top]).item():.2f})"
        print(f"  {tokenizer.decode([tokens[i]])!r:>18} p={p:.2f}{mark}")


if __name__ == "__main__":
    main()

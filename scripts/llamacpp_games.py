"""Whole games for `make llamacpp-check`: the exported GGUF plays in llama.cpp with its grammar, next to wordle-mlx.

Both sides play the first N test words from an empty board, greedily, through wordle-mlx's own game loop
(`rollout.play_games`: the same prompts, reply parsing, invalid-reply rules and game end). wordle-mlx plays
the adapter (mlx-lm with the LoRA) in the adapter's decoding mode; llama.cpp is a `generate_fn` backend: a
worker process in the llama-cpp-python venv (`--serve`, one JSON line per turn over stdin/stdout) that
tokenizes each prompt's text itself and decodes greedily (temperature 0) through llama-cpp-python's sampler with
the exported GBNF grammar (`LlamaGrammar.from_file`; no grammar in free decoding, which stops at `</guess>` as
wordle-mlx does), until an end-of-generation token. In words decoding a static grammar cannot rule out the words
already on the board, which wordle-mlx's words decoding does; so from the second turn on each prompt gets the
words grammar of the allowed guesses minus its board (`words_gbnf`, as `export` writes it), and the two sides
decode the same policy. A game is identical when every turn's reply text is the same; for each other game the
first differing turn is reported, with both replies and whether llama.cpp's guess was already on the board. The
worker imports only llama_cpp and the standard library, since the other venv has no wordle-mlx.

    python scripts/llamacpp_games.py --serve JOB.json      # the worker (started by llamacpp_check.py)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

STOP_TEXT = "</guess>"


# ---------------------------------------------------------------- llama.cpp side (runs in .venv-llamacpp)

def serve(job_path: str) -> None:
    """Answer one JSON line per turn, {"texts": [...], "grammars": [GBNF text or null, ...]}, with
    {"replies": [{tokens, text, ended, prompt_ids}]}; a null grammar is the job's grammar file."""
    import llama_cpp
    from llama_cpp import Llama, LlamaGrammar

    job = json.loads(Path(job_path).read_text())
    llm = Llama(model_path=job["gguf"], n_ctx=job["n_ctx"], n_batch=job["n_ctx"], n_threads=job["threads"],
                verbose=False)
    default = LlamaGrammar.from_file(job["grammar"], verbose=False) if job["grammar"] else None
    grammars: dict[str, LlamaGrammar] = {}       # per-board grammars, by their text
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out = sys.stdout
    sys.stdout = sys.stderr          # anything else printed must not reach the protocol stream
    for line in sys.stdin:
        replies = []
        request = json.loads(line)
        for text, gbnf in zip(request["texts"], request.get("grammars") or [None] * len(request["texts"])):
            if gbnf is not None and gbnf not in grammars:
                grammars[gbnf] = LlamaGrammar.from_string(gbnf, verbose=False)
            grammar = default if gbnf is None else grammars[gbnf]
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            tokens, ended = [], False
            for token in llm.generate(ids, temp=0.0, repeat_penalty=1.0, grammar=grammar):
                if llama_cpp.llama_vocab_is_eog(vocab, token):
                    tokens.append(token)
                    ended = True
                    break
                tokens.append(token)
                if len(tokens) >= job["max_tokens"]:
                    break
                if grammar is None and STOP_TEXT in llm.detokenize(tokens).decode("utf-8", "replace"):
                    ended = True
                    break
            body = [t for t in tokens if not llama_cpp.llama_vocab_is_eog(vocab, t)]
            replies.append({"tokens": tokens, "text": llm.detokenize(body).decode("utf-8", "replace"),
                            "ended": ended, "prompt_ids": ids})
        out.write(json.dumps({"replies": replies}) + "\n")
        out.flush()


# ---------------------------------------------------------------- wordle-mlx side

class LlamaCppBackend:
    """A rollout `generate_fn` that asks the llama.cpp worker for each prompt's greedy reply. In words decoding
    (`words`: the allowed guesses) a prompt with words on its board gets the grammar of the others."""

    takes_boards = True       # the rollout passes each prompt's board words (`excluded`)

    def __init__(self, python: Path, job_file: Path, tokenizer, env: dict):
        from wordle_mlx.llm.play.gbnf import reply_pieces

        self.tokenizer, self.pieces = tokenizer, reply_pieces(tokenizer)
        self.words: frozenset[str] | None = None     # set by play_both in words decoding
        self.proc = subprocess.Popen([str(python), __file__, "--serve", str(job_file)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.prompts = self.same_prompts = 0

    def __call__(self, prompts, cfg, excluded=None, **_):
        from wordle_mlx.llm.play.gbnf import words_gbnf
        from wordle_mlx.llm.play.generation import Completion

        texts = [self.tokenizer.decode(list(p)) for p in prompts]
        boards = excluded or [()] * len(prompts)
        grammars = [words_gbnf(self.words - set(b), self.pieces) if self.words is not None and b else None
                    for b in boards]
        self.proc.stdin.write(json.dumps({"texts": texts, "grammars": grammars}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker ended (exit {self.proc.wait()})")
        replies = json.loads(line)["replies"]
        self.prompts += len(prompts)
        self.same_prompts += sum(list(p) == r["prompt_ids"] for p, r in zip(prompts, replies))
        return [Completion(tokens=r["tokens"], logprobs=[0.0] * len(r["tokens"]), text=r["text"],
                           finish_reason="stop" if r["ended"] else "length") for r in replies]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def game_record(episode) -> dict:
    return {"secret": episode.secret, "won": episode.won, "guesses": list(episode.state.guesses),
            "replies": [t.text for t in episode.turns], "tokens": [list(t.completion_tokens) for t in episode.turns],
            "played": [t.guess if t.pattern is not None else None for t in episode.turns]}


def first_differing_turn(ours: dict, theirs: dict) -> dict | None:
    """The first turn whose reply differs (1-based), both replies and the board before it; None when the same."""
    a, b = ours["replies"], theirs["replies"]
    j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if j == len(a) == len(b):
        return None
    board = [g for g in ours["played"][:j] if g is not None]      # the turns before j are the same on both sides
    return {"turn": j + 1, "wordle_mlx": (a + [None])[j], "llama_cpp": (b + [None])[j], "board": board,
            "llama_cpp_tokens": (theirs["tokens"] + [[]])[j]}


def play_both(model, tokenizer, adapter: Path, count: int, backend: LlamaCppBackend) -> dict:
    """N greedy test games on each side in the adapter's decoding mode; the comparison for the report."""
    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.words import guess_list
    from wordle_mlx.llm.play.prompts import parse_reply
    from wordle_mlx.llm.play.reply_grammar import LetterGrammar
    from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig, decode_mode, play_games

    rollout = RolloutConfig(temperature=0.0).for_adapter(str(adapter))
    mode = decode_mode(rollout)
    allowed = frozenset(guess_list())
    specs = [GameSpec(secret=w) for w in split_words("test")[:count]]
    ours = [game_record(e) for e in play_games(model, tokenizer, specs, rollout, allowed)]
    backend.words = allowed if mode == "words" else None
    theirs = [game_record(e) for e in play_games(None, tokenizer, specs, rollout, allowed, generate_fn=backend)]
    letters = LetterGrammar.for_tokenizer(tokenizer)
    reply_tokens = {*letters.open, *letters.sep, *letters.letter_ids, *letters.close, *tokenizer.eos_token_ids}
    differing = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        first = first_differing_turn(a, b)
        if first is None:
            continue
        guess = parse_reply(first["llama_cpp"] or "", rollout.prompt.require_think, allowed).guess
        other_tokens = [t for t in first.pop("llama_cpp_tokens") if t not in reply_tokens]
        differing.append({"game": i, "secret": a["secret"], **first,
                          "llama_cpp_repeats_a_board_word": guess in first["board"],
                          "llama_cpp_other_tokens": [tokenizer.decode([t]) for t in other_tokens],
                          "wordle_mlx_won": a["won"], "llama_cpp_won": b["won"]})
    unexplained = [d for d in differing if not d["llama_cpp_other_tokens"]]
    return {"decode": mode, "games": len(specs), "games_identical": len(specs) - len(differing),
            "games_same_or_other_tokens": len(specs) - len(unexplained),
            "wins_wordle_mlx": sum(g["won"] for g in ours), "wins_llama_cpp": sum(g["won"] for g in theirs),
            "prompts_tokenized_the_same": f"{backend.same_prompts}/{backend.prompts}", "differing": differing}


def show(games: dict) -> None:
    for d in games["differing"]:
        note = " (a word already on the board: a grammar cannot rule it out)" if d["llama_cpp_repeats_a_board_word"] else ""
        if d["llama_cpp_other_tokens"]:
            note += f" (llama.cpp spelled it with other tokens: {d['llama_cpp_other_tokens']!r})"
        print(f"  game {d['game']} ({d['secret']}): first difference at turn {d['turn']}: wordle-mlx {d['wordle_mlx']!r} "
              f"vs llama.cpp {d['llama_cpp']!r}{note}")
    print(f"games in {games['decode']} decoding: wins wordle-mlx {games['wins_wordle_mlx']}/{games['games']}, "
          f"llama.cpp {games['wins_llama_cpp']}/{games['games']}; prompts tokenized the same by llama.cpp "
          f"{games['prompts_tokenized_the_same']}; games that differ only where llama.cpp spelled a reply with "
          f"tokens wordle-mlx never picks: {games['games_same_or_other_tokens'] - games['games_identical']}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        sys.exit(__doc__.strip().splitlines()[-1].strip())

"""Whole games for `make llamacpp-check`: the exported GGUF plays in llama.cpp with its grammar, next to wordle-mlx.

Both sides play the first N test words from an empty board, greedily, through wordle-mlx's own game loop
(`rollout.play_games`: the same prompts, reply parsing, invalid-reply rules and game end). wordle-mlx plays
the adapter (mlx-lm with the LoRA) in the adapter's decoding mode; llama.cpp is a `generate_fn` backend: a
worker process in the llama-cpp-python venv (`--serve`, one JSON line per turn over stdin/stdout) that
tokenizes each prompt's text itself and decodes greedily (temperature 0) as llama.cpp's own sampler does, with
the exported GBNF grammar (llama.cpp's grammar sampler; no grammar in free decoding, which stops at `</guess>` as
wordle-mlx does) and the exported logit bias (`NAME.logit_bias.json`: every token a reply never takes, banned, so
that llama.cpp spells a reply with the decoder's own tokens), until an end-of-generation token. In words decoding
a static grammar cannot rule out the words already on the board, which wordle-mlx's words decoding does; so from
the second turn on each prompt gets its board's grammar (the allowed guesses minus the board's, as
`wordle-mlx grammar` writes it), and the two sides decode the same policy. A game is identical when every turn's
reply text is the same; for each other game the first differing turn is reported, with both replies, whether
llama.cpp's guess was already on the board, and wordle-mlx's own margins at the first differing token
(`margins`): its top-1 minus top-2 logit among the tokens its decoding allows there, and its logit for its own
token minus its logit for llama.cpp's. The worker imports only llama_cpp, numpy and the standard library, since
the other venv has no wordle-mlx.

    python scripts/llamacpp_games.py --serve JOB.json      # the worker (started by llamacpp_check.py)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

STOP_TEXT = "</guess>"
PROMPT_BATCH = 64         # llama.cpp's prompt batch: a prompt of ~40-200 tokens ran 5x faster in 64s than in one 1024


# ---------------------------------------------------------------- llama.cpp side (runs in .venv-llamacpp)

def serve(job_path: str) -> None:
    """Answer one JSON line per turn, {"texts": [...], "grammars": [GBNF text or null, ...]}, with
    {"replies": [{tokens, text, ended, prompt_ids}]}; a null grammar is the job's grammar file.

    Greedy decoding as llama.cpp's own sampler does it (`common_sampler_sample`, which llama-cli and llama-server
    run): the logit bias first, then the highest-logit token the grammar allows, which llama.cpp's grammar sampler
    is asked about one candidate at a time in logit order. llama-cpp-python's `generate` runs the grammar over all
    262k candidates instead, about 2.5 s a token here, with the same result."""
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    job = json.loads(Path(job_path).read_text())
    kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if job.get("kv_cache") == "f32" else {}
    llm = Llama(model_path=job["gguf"], n_ctx=job["n_ctx"], n_batch=PROMPT_BATCH, n_threads=job["threads"],
                verbose=False, **kv)
    vocab, n_vocab = llama_cpp.llama_model_get_vocab(llm.model), llm.n_vocab()
    default = Path(job["grammar"]).read_text() if job["grammar"] else None
    banned = None
    if job.get("logit_bias"):       # the export's logit bias, [[id, false], ...]: these tokens are never taken
        banned = np.array([token for token, _ in json.loads(Path(job["logit_bias"]).read_text())], dtype=np.int64)

    def last_logits() -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        row = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).copy()
        if banned is not None:
            row[banned] = -np.inf
        return row

    def allows(sampler, token: int) -> bool:
        data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
        candidates = llama_cpp.llama_token_data_array(data, 1, -1, False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
        return not np.isinf(data[0].logit)

    def greedy(row: np.ndarray, sampler) -> int:
        if sampler is None:
            return int(np.argmax(row))
        order = np.lexsort((np.arange(len(row)), -row))      # by logit, ties to the lower id (argmax's choice)
        for token in order:
            if np.isneginf(row[token]):
                break
            if allows(sampler, int(token)):
                return int(token)
        raise RuntimeError("the grammar and the logit bias leave no token")

    out = sys.stdout
    sys.stdout = sys.stderr          # anything else printed must not reach the protocol stream
    for line in sys.stdin:
        replies = []
        request = json.loads(line)
        for text, gbnf in zip(request["texts"], request.get("grammars") or [None] * len(request["texts"])):
            gbnf = default if gbnf is None else gbnf
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root") if gbnf else None
            if gbnf and not sampler:
                raise RuntimeError("llama.cpp could not parse a grammar")
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            llm.reset()
            llm.eval(ids)
            tokens, ended = [], False
            while True:
                token = greedy(last_logits(), sampler)
                tokens.append(token)
                if llama_cpp.llama_vocab_is_eog(vocab, token):
                    ended = True
                    break
                if sampler is not None:
                    llama_cpp.llama_sampler_accept(sampler, token)
                if len(tokens) >= job["max_tokens"]:
                    break
                if sampler is None and STOP_TEXT in llm.detokenize(tokens).decode("utf-8", "replace"):
                    ended = True
                    break
                llm.eval([token])
            if sampler is not None:
                llama_cpp.llama_sampler_free(sampler)
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
        from wordle_mlx.llm.play.gbnf import reply_gbnf
        from wordle_mlx.llm.play.generation import Completion

        texts = [self.tokenizer.decode(list(p)) for p in prompts]
        boards = excluded or [()] * len(prompts)
        grammars = [reply_gbnf("words", self.pieces, self.words, b) if self.words is not None and b else None
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
            "played": [t.guess if t.pattern is not None else None for t in episode.turns],
            "prompts": [list(t.prompt_tokens) for t in episode.turns], "repeats": sum(t.repeated for t in episode.turns)}


def first_differing_turn(ours: dict, theirs: dict) -> dict | None:
    """The first turn whose reply differs (1-based), both replies and the board before it; None when the same."""
    a, b = ours["replies"], theirs["replies"]
    j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if j == len(a) == len(b):
        return None
    board = [g for g in ours["played"][:j] if g is not None]      # the turns before j are the same on both sides
    return {"turn": j + 1, "wordle_mlx": (a + [None])[j], "llama_cpp": (b + [None])[j], "board": board,
            "llama_cpp_tokens": (theirs["tokens"] + [[]])[j]}


def margins(model, tokenizer, mode: str, allowed: frozenset[str], ours: dict, theirs: dict, turn: int) -> dict:
    """wordle-mlx's margins at the first token where the two sides' replies of `turn` (1-based) differ: its top-1
    minus top-2 logit among the tokens its decoding allows there (the 26 letters in grammar decoding, those that
    continue an allowed word off the board in words decoding, any token in free decoding) and its logit for its
    own token minus its logit for llama.cpp's (None when its decoding does not allow llama.cpp's token)."""
    import mlx.core as mx
    import numpy as np

    from wordle_mlx.llm.play.reply_grammar import LETTERS, LetterGrammar, WordTrie

    j = turn - 1
    a, b = ours["tokens"][j], (theirs["tokens"] + [[]])[j]
    k = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if k >= len(a) or k >= len(b):
        return {"token": k, "top2_margin": None, "gap_to_llama_cpp": None}
    row = np.array(model(mx.array([ours["prompts"][j] + a[:k]]))[0, -1].astype(mx.float32))
    letters = LetterGrammar.for_tokenizer(tokenizer)
    if mode == "free":
        options = np.arange(len(row))
    else:
        written = "".join(LETTERS[letters.index_of[t]] for t in a[:k] if t in letters.index_of)
        if a[k] not in letters.index_of:
            return {"token": k, "top2_margin": None, "gap_to_llama_cpp": None}
        board = [g for g in ours["played"][:j] if g is not None]
        ok = WordTrie(allowed).allowed(written, board) if mode == "words" else np.ones(26, dtype=bool)
        options = np.array([t for t, keep in zip(letters.letter_ids, ok) if keep])
    top = np.sort(row[options])[::-1]
    top2 = float(top[0] - top[1]) if len(top) > 1 else None
    gap = float(row[a[k]] - row[b[k]]) if b[k] in set(options.tolist()) else None
    return {"token": k, "top2_margin": top2, "gap_to_llama_cpp": gap, "argmax_is_ours": int(options[np.argmax(row[options])]) == a[k]}


def play_both(model, tokenizer, adapter: Path, count: int, backend: LlamaCppBackend) -> dict:
    """N greedy test games on each side in the adapter's decoding mode; the comparison for the report."""
    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.words import guess_list
    from wordle_mlx.llm.play.gbnf import reply_token_ids
    from wordle_mlx.llm.play.prompts import parse_reply
    from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig, decode_mode, play_games

    rollout = RolloutConfig(temperature=0.0).for_adapter(str(adapter))
    mode = decode_mode(rollout)
    allowed = frozenset(guess_list())
    specs = [GameSpec(secret=w) for w in split_words("test")[:count]]
    ours = [game_record(e) for e in play_games(model, tokenizer, specs, rollout, allowed)]
    backend.words = allowed if mode == "words" else None
    theirs = [game_record(e) for e in play_games(None, tokenizer, specs, rollout, allowed, generate_fn=backend)]
    reply_tokens = set(reply_token_ids(tokenizer))       # the tokens the logit bias leaves
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
                          "margins": margins(model, tokenizer, mode, allowed, a, b, first["turn"]),
                          "wordle_mlx_won": a["won"], "llama_cpp_won": b["won"]})
    return {"decode": mode, "games": len(specs), "games_identical": len(specs) - len(differing),
            "wins_wordle_mlx": sum(g["won"] for g in ours), "wins_llama_cpp": sum(g["won"] for g in theirs),
            "llama_cpp_repeated_guesses": sum(g["repeats"] for g in theirs),
            "prompts_tokenized_the_same": f"{backend.same_prompts}/{backend.prompts}", "differing": differing}


def near_ties(games: dict, logit_error: float) -> dict:
    """Marks each differing game a near-tie when wordle-mlx's own logit for its token exceeds its logit for
    llama.cpp's by less than `logit_error` (the GGUF's measured logit error), and llama.cpp took no token and no
    guess that wordle-mlx's decoding rules out; adds the counts."""
    for d in games["differing"]:
        gap = d["margins"]["gap_to_llama_cpp"]
        d["near_tie"] = (gap is not None and gap < logit_error and not d["llama_cpp_other_tokens"]
                         and not d["llama_cpp_repeats_a_board_word"])
    ties = sum(d["near_tie"] for d in games["differing"])
    games.update(logit_error=logit_error, near_ties=ties, games_identical_or_near_tie=games["games_identical"] + ties)
    return games


def show(games: dict) -> None:
    for d in games["differing"]:
        note = " (a word already on the board)" if d["llama_cpp_repeats_a_board_word"] else ""
        if d["llama_cpp_other_tokens"]:
            note += f" (llama.cpp spelled it with other tokens: {d['llama_cpp_other_tokens']!r})"
        m = d["margins"]
        gap = "n/a" if m["gap_to_llama_cpp"] is None else f"{m['gap_to_llama_cpp']:.3g}"
        top2 = "n/a" if m["top2_margin"] is None else f"{m['top2_margin']:.3g}"
        kind = "near-tie" if d.get("near_tie") else "DIFFERS"
        print(f"  {kind} game {d['game']} ({d['secret']}): turn {d['turn']}, reply token {m['token']}: wordle-mlx "
              f"{d['wordle_mlx']!r} vs llama.cpp {d['llama_cpp']!r}; wordle-mlx top-2 margin {top2}, its margin "
              f"over llama.cpp's token {gap}{note}")
    print(f"games in {games['decode']} decoding: wins wordle-mlx {games['wins_wordle_mlx']}/{games['games']}, "
          f"llama.cpp {games['wins_llama_cpp']}/{games['games']}; prompts tokenized the same by llama.cpp "
          f"{games['prompts_tokenized_the_same']}; guesses llama.cpp repeated: {games['llama_cpp_repeated_guesses']}; "
          f"identical {games['games_identical']}, near-ties {games.get('near_ties', 0)} (margin below the logit "
          f"error {games.get('logit_error', 0):.3g})")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        sys.exit(__doc__.strip().splitlines()[-1].strip())

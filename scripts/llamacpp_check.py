"""`make llamacpp-check`: does llama.cpp play the exported GGUF exactly as wordle-mlx plays the adapter?

Uses the pinned `llama-cpp-python` of this venv (requirements-test.txt, which the make target installs), else
installs it from PyPI into its own venv (`.venv-llamacpp`; it compiles llama.cpp from source, one compile job at
a time, `-DGGML_NATIVE=ON`), exports the shipped adapter
(`adapters/gemma-3-270m-wordle` on `builtin:gemma-3-270m`) with `wordle-mlx export` (float16 by default, `--dtype`),
which also writes the GBNF grammar of the adapter's decoding mode and its logit bias beside the GGUF, and runs two
comparisons. llama.cpp keeps its KV cache in float32 here (`--kv-cache f32`; its default is f16), which takes one
source of the logit difference away: what is left is the GGUF's storage (`--dtype`) and llama.cpp's own arithmetic.

Single replies: 100 boards of the held-out test split, for the i-th test word the board after 1 + i % 3 of the
entropy solver's guesses (fewer when the solver wins sooner). For each board the adapter's recorded
prompt is rendered with the chat template to text; wordle-mlx (mlx-lm with the LoRA adapter, not the
GGUF) replies greedily in free decoding, and llama.cpp, run in a subprocess with the other venv's Python,
tokenizes the same text itself, replies greedily (argmax of its logits) and is teacher-forced on wordle-mlx's
reply to give its top-1 token at every reply position (the end-of-turn token included). It prints: boards
with the same greedy reply, top-1 agreement over reply positions, prompts tokenized the same, the largest
logit difference on wordle-mlx's top-5 tokens, and the first differing position of each board that differs.

Whole games (`llamacpp_games.py`): the first 100 test words played greedily from an empty board by both, in
the adapter's decoding mode, llama.cpp with the exported grammar (each board's own in words decoding) and logit
bias; it prints the wins on each side, the guesses llama.cpp repeated, the first differing turn of each differing
game with wordle-mlx's margins there, and ends with `games_identical N/100`. A game that first differs where
wordle-mlx's logit for its own token exceeds its logit for llama.cpp's by less than the largest logit difference
measured on the single replies is a near-tie: listed with its margins and counted as identical, since the GGUF
cannot be expected to order it the same. Any other difference (a spelling, a repeat, a wide margin) is a defect.
Exit 0 when >= 98/100 replies match, top-1 agreement >= 0.99, >= 98/100 games are identical or near-ties and
llama.cpp repeats no guess. Results go to `logs/llamacpp-check/result.json`.

    python scripts/llamacpp_check.py [--boards 100] [--games 100] [--dtype float16] [--kv-cache f32] [--reuse-gguf]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import llamacpp_games

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
ADAPTER = ROOT / "adapters" / "gemma-3-270m-wordle"
MAX_REPLY_TOKENS = 32
TOP_K = 5
NEED_SAME_REPLIES, NEED_TOP1, NEED_SAME_GAMES = 0.98, 0.99, 0.98
GAME_CTX = 1024


# ---------------------------------------------------------------- llama.cpp side (runs in .venv-llamacpp)

def worker(job_path: str, result_path: str) -> None:
    """Teacher-forced top-1 tokens and greedy replies from llama.cpp for every board of the job file.

    Teacher-forced on wordle-mlx's reply, llama.cpp's top-1 at each position is its greedy choice while the
    reply so far is the same; so its greedy reply is wordle-mlx's when every top-1 agrees, and otherwise
    greedy decoding goes on from the first position where they differ."""
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    job = json.loads(Path(job_path).read_text())
    kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if job.get("kv_cache") == "f32" else {}
    llm = Llama(model_path=job["gguf"], n_ctx=job["n_ctx"], n_batch=job["n_ctx"], n_threads=job["threads"],
                logits_all=False, verbose=False, **kv)
    n_vocab, stop = llm.n_vocab(), set(job["stop_ids"])
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    eog = [t for t in sorted(stop) if llama_cpp.llama_vocab_is_eog(vocab, t)]    # llama.cpp's own end-of-generation set

    def last_logits():
        pointer = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).copy()

    results = []
    for board in job["boards"]:
        ids = llm.tokenize(board["text"].encode("utf-8"), add_bos=False, special=True)
        forced = board["our_reply"]
        llm.reset()
        llm.eval(ids)
        top1, diffs = [], []
        for j, token in enumerate(forced):
            row = last_logits()
            top1.append(int(np.argmax(row)))
            ours = board["our_topk"][j]
            diffs.append(max(abs(float(row[t]) - v) for t, v in zip(ours["ids"], ours["logits"])))
            if j + 1 < len(forced):
                llm.eval([token])
        split = next((j for j, (a, b) in enumerate(zip(top1, forced)) if a != b), None)
        reply = list(forced) if ids == board["our_prompt_ids"] and split is None else None
        if reply is None:           # greedy from scratch up to the first difference, then on its own
            split = split or 0
            reply = list(forced[:split])
            llm.reset()
            llm.eval(ids + reply)
            while len(reply) < job["max_tokens"]:
                token = int(np.argmax(last_logits()))
                reply.append(token)
                if token in stop:
                    break
                llm.eval([token])
        results.append({"prompt_ids": ids, "reply": reply, "reply_text": llm.detokenize(reply).decode("utf-8", "replace"),
                        "top1": top1, "topk_logit_diff": diffs})
    Path(result_path).write_text(json.dumps({"boards": results, "eog_stop_ids": eog}))


# ---------------------------------------------------------------- wordle-mlx side

def ensure_llamacpp(venv: Path) -> Path:
    """A Python with the pinned llama_cpp: this one when requirements-test.txt installed it, else the venv's,
    installed from PyPI (a source build) the first time."""
    pinned = LLAMA_CPP_PYTHON.split("==")[1]
    try:
        if importlib.metadata.version("llama-cpp-python") == pinned:
            return Path(sys.executable)
    except importlib.metadata.PackageNotFoundError:
        pass
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return python
    print(f"installing {LLAMA_CPP_PYTHON} into {venv} (compiles llama.cpp; one job at a time)", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "1"),
           "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", "-DGGML_NATIVE=ON -DLLAMA_CURL=OFF")}
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", LLAMA_CPP_PYTHON, "numpy"], check=True, env=env)
    return python


def test_boards(count: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """(secret, board) for the first `count` test words: the board after 1 + i % 3 of the solver's guesses."""
    from wordle_mlx.game.feedback import feedback
    from wordle_mlx.game.solver import Solver
    from wordle_mlx.game.splits import split_words
    from wordle_mlx.stages.pattern_table import load_table

    solver = Solver(load_table(show_progress=False))
    boards = []
    for i, secret in enumerate(split_words("test")[:count]):
        game = solver.play(secret)
        depth = min(1 + i % 3, len(game) - 1)
        boards.append((secret, [(g, feedback(g, secret)) for g in game[:depth]]))
    return boards


def greedy_reply(model, prompt_ids: list[int], stop: set[int]) -> tuple[list[int], list[dict]]:
    """wordle-mlx's greedy reply (argmax each step, KV cache) and its top-k logits at every reply position."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt_ids]), cache=cache)[0, -1].astype(mx.float32)
    reply, topk = [], []
    while len(reply) < MAX_REPLY_TOKENS:
        top = mx.argpartition(-logits, TOP_K - 1)[:TOP_K]
        mx.eval(top, logits)
        ids = sorted((int(t) for t in top.tolist()), key=lambda t: -logits[t].item())
        topk.append({"ids": ids, "logits": [float(logits[t].item()) for t in ids]})
        reply.append(ids[0])
        if ids[0] in stop:
            break
        logits = model(mx.array([[ids[0]]]), cache=cache)[0, -1].astype(mx.float32)
    return reply, topk


def wordle_mlx_replies(model, tokenizer, count: int) -> dict:
    """The job for llama.cpp: each board's prompt text, wordle-mlx's prompt ids, greedy reply and top-k logits."""
    from wordle_mlx.llm.play.tokens import end_token_ids
    from wordle_mlx.llm.play.prompts import adapter_prompt, build_messages

    prompt, stop, boards = adapter_prompt(ADAPTER), end_token_ids(tokenizer), []
    for secret, board in test_boards(count):
        messages = build_messages(prompt, board)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        reply, topk = greedy_reply(model, ids, stop)
        boards.append({"secret": secret, "board": board, "text": text, "our_prompt_ids": ids, "our_reply": reply,
                       "our_topk": topk})
    return {"stop_ids": sorted(stop), "boards": boards}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boards", type=int, default=100)
    parser.add_argument("--games", type=int, default=100, help="Whole games to compare (0: none).")
    parser.add_argument("--dtype", default="float16", choices=("float32", "float16", "q8"),
                        help="The GGUF's matrix storage (export --dtype).")
    parser.add_argument("--kv-cache", default="f32", choices=("f32", "f16"),
                        help="llama.cpp's KV cache type (its own default is f16).")
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-llamacpp")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "logs" / "llamacpp-check")
    parser.add_argument("--reuse-gguf", action="store_true", help="Keep an existing exported GGUF.")
    parser.add_argument("--reuse-replies", action="store_true",
                        help="Keep wordle-mlx's replies from an earlier run's job.json (same boards).")
    parser.add_argument("--replies-only", action="store_true",
                        help="Stop after wordle-mlx's replies (job.json), e.g. while llama.cpp still builds.")
    parser.add_argument("--llama-python", type=Path,
                        help="A Python that can already import llama_cpp (skips the .venv-llamacpp install).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    sys.path.insert(0, str(ROOT))
    from wordle_mlx.runtime.blas import reexec_for_linux_cpu
    reexec_for_linux_cpu()     # MLX's bundled reference BLAS is ~30x slower on Linux
    from wordle_mlx.llm.model.models import load_model
    from wordle_mlx.llm.play.prompts import parse_reply
    from wordle_mlx.stages import export

    start = time.perf_counter()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    gguf = args.out_dir / f"wordle-270m-{args.dtype}.gguf"
    if not (args.reuse_gguf and gguf.is_file()):
        export.run(export.ExportConfig(adapter=str(ADAPTER), out=str(gguf), dtype=args.dtype, overwrite=True,
                                       json_output=True))
    grammar = gguf.with_suffix(".gbnf")
    print(f"exported {gguf} ({gguf.stat().st_size / 1e6:.0f} MB)", flush=True)
    model, tokenizer = load_model("builtin:gemma-3-270m", adapter_path=ADAPTER)
    job_file, result_file = args.out_dir / "job.json", args.out_dir / "llamacpp.json"
    if args.reuse_replies and job_file.is_file() and len(json.loads(job_file.read_text())["boards"]) == args.boards:
        job = json.loads(job_file.read_text())
    else:
        job = wordle_mlx_replies(model, tokenizer, args.boards)
        n_ctx = max(len(b["our_prompt_ids"]) + len(b["our_reply"]) for b in job["boards"]) + MAX_REPLY_TOKENS + 16
        job.update({"gguf": str(gguf), "n_ctx": n_ctx, "threads": args.threads, "max_tokens": MAX_REPLY_TOKENS})
    job["kv_cache"] = args.kv_cache
    job_file.write_text(json.dumps(job))
    print(f"wordle-mlx replied on {len(job['boards'])} boards ({time.perf_counter() - start:.0f} s)", flush=True)
    if args.replies_only:
        return 0
    python = args.llama_python or ensure_llamacpp(args.venv)
    print(f"llama.cpp ({LLAMA_CPP_PYTHON}) replies on the same prompt texts", flush=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}   # OpenBLAS is for MLX, not llama.cpp
    subprocess.run([str(python), __file__, "--worker", str(job_file), str(result_file)], check=True, env=env)
    theirs = json.loads(result_file.read_text())

    same_replies = same_prompts = positions = agree = 0
    worst_diff, scale, differing = 0.0, 0.0, []
    job = job["boards"]
    for i, (ours, llama) in enumerate(zip(job, theirs["boards"])):
        same_prompts += ours["our_prompt_ids"] == llama["prompt_ids"]
        positions += len(ours["our_reply"])
        agree += sum(a == b for a, b in zip(ours["our_reply"], llama["top1"]))
        worst_diff = max(worst_diff, *llama["topk_logit_diff"])
        scale = max(scale, *(abs(v) for k in ours["our_topk"] for v in k["logits"]))
        if ours["our_reply"] == llama["reply"]:
            same_replies += 1
            continue
        j = first_difference(ours["our_reply"], llama["reply"])
        differing.append({"board": i, "secret": ours["secret"], "position": j,
                          "ours": tokenizer.decode(ours["our_reply"]), "llama_cpp": llama["reply_text"],
                          "our_top2_gap": ours["our_topk"][j]["logits"][0] - ours["our_topk"][j]["logits"][1]
                          if j is not None and j < len(ours["our_topk"]) else None})
    n = len(job)
    top1 = agree / positions
    games = None
    if args.games:
        print(f"{args.games} whole games on each side, greedy, llama.cpp with {grammar.name if grammar.is_file() else 'no grammar'}",
              flush=True)
        game_job = args.out_dir / "games-job.json"
        bias = gguf.with_suffix(".logit_bias.json")
        game_job.write_text(json.dumps({"gguf": str(gguf), "grammar": str(grammar) if grammar.is_file() else None,
                                        "logit_bias": str(bias) if bias.is_file() else None, "kv_cache": args.kv_cache,
                                        "n_ctx": GAME_CTX, "threads": args.threads, "max_tokens": MAX_REPLY_TOKENS}))
        backend = llamacpp_games.LlamaCppBackend(python, game_job, tokenizer, env)
        try:
            games = llamacpp_games.near_ties(llamacpp_games.play_both(model, tokenizer, ADAPTER, args.games, backend),
                                             worst_diff)
        finally:
            backend.close()
    passed = (same_replies >= NEED_SAME_REPLIES * n and top1 >= NEED_TOP1
              and (games is None or (games["games_identical_or_near_tie"] >= NEED_SAME_GAMES * games["games"]
                                     and games["llama_cpp_repeated_guesses"] == 0)))
    summary = {"boards": n, "same_greedy_reply": same_replies, "top1_agreement": round(top1, 5),
               "reply_positions": positions, "prompts_tokenized_the_same": same_prompts,
               "max_top5_logit_diff": round(worst_diff, 5), "max_abs_logit": round(scale, 3),
               "min_top2_gap_ours": round(min(k["logits"][0] - k["logits"][1] for b in job for k in b["our_topk"]), 5),
               "llama_cpp_eog_stop_ids": theirs["eog_stop_ids"], "differing": differing,
               "well_formed_replies_ours": sum(parse_reply(tokenizer.decode(b["our_reply"]), False).error is None for b in job),
               "games": games, "passed": passed, "llama_cpp_python": LLAMA_CPP_PYTHON, "gguf": str(gguf),
               "seconds": round(time.perf_counter() - start, 1)}
    (args.out_dir / "result.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"same greedy reply on {same_replies}/{n} boards")
    print(f"top-1 agreement over reply positions: {agree}/{positions} = {top1:.4f}")
    print(f"prompts tokenized the same by llama.cpp: {same_prompts}/{n}")
    print(f"largest logit difference on wordle-mlx's top-{TOP_K} tokens: {worst_diff:.4g} (largest |logit| {scale:.3g})")
    print(f"closest wordle-mlx decision (top-1 minus top-2 logit): {summary['min_top2_gap_ours']:.4g}")
    for d in differing:
        print(f"  board {d['board']} ({d['secret']}): first difference at reply position {d['position']}: "
              f"wordle-mlx {d['ours']!r} vs llama.cpp {d['llama_cpp']!r} (wordle-mlx top-2 gap {d['our_top2_gap']})")
    if games is not None:
        llamacpp_games.show(games)
    print(("PASS" if passed else "FAIL") + f": need >= {NEED_SAME_REPLIES * n:.0f}/{n} same replies, top-1 >= {NEED_TOP1}"
          + (f", >= {NEED_SAME_GAMES * games['games']:.0f}/{games['games']} games identical or near-ties and no guess"
             " repeated by llama.cpp" if games else ""))
    if games is not None:
        print(f"games_identical {games['games_identical_or_near_tie']}/{games['games']}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

"""How often is a greedy non-word a confident one? Plays the first N training words greedily with an adapter,
then draws 8 replies at T = 1 at every turn whose greedy reply was not a playable word, and counts the groups
with no allowed word. Usage: .venv/bin/python docs/results/s16/diagnostic_dead_groups.py ADAPTER N"""
import math, sys, time
import numpy as np
from wordle_mlx.blas import reexec_with_openblas; reexec_with_openblas()
from wordle_mlx.llm.models import load_model
from wordle_mlx.llm.rollout import RolloutConfig, GameSpec, play_games, sample_replies
from wordle_mlx.llm.prompts import parse_reply
from wordle_mlx.game.splits import split_words
from wordle_mlx.game.words import guess_list

adapter = sys.argv[1]; n = int(sys.argv[2]); G = 8
model, tok = load_model("builtin:gemma-3-270m", adapter)
allowed = frozenset(guess_list())
cfg = RolloutConfig(max_tokens_per_turn=16, completion_batch_size=64).for_adapter(adapter)
words = split_words("train")[:n]
t = time.time()
eps = play_games(model, tok, [GameSpec(w) for w in words], cfg, allowed)
print("greedy wins", sum(e.won for e in eps), "of", n, f"{time.time()-t:.0f}s")
bad = [(e, tr) for e in eps for tr in e.turns if tr.error is not None]
allt = [tr for e in eps for tr in e.turns]
print("turns", len(allt), "errors", len(bad), {k: sum(1 for _, tr in bad if tr.error == k) for k in set(tr.error for _, tr in bad)})
p = [math.exp(sum(tr.logprobs)) for _, tr in bad]
print("p(greedy error reply) quartiles", np.percentile(p, [10, 25, 50, 75, 90]).round(3).tolist())
scfg = cfg.model_copy(update={"temperature": 1.0, "seed": 1})
outs = sample_replies(model, tok, [tr.prompt_tokens for _, tr in bad], G, scfg)
dead_bad = dead_any = 0; nvalid = []
for (e, tr), group in zip(bad, outs):
    kinds = []
    for c in group:
        pr = parse_reply(c.text, cfg.prompt.require_think, allowed)
        kinds.append(pr.error is None)
    nvalid.append(sum(kinds))
    dead_bad += sum(kinds) == 0
print(f"groups at greedy-error turns: {len(bad)}; all {G} samples invalid: {dead_bad} ({dead_bad/len(bad):.0%})")
print("valid samples per group histogram", np.bincount(nvalid, minlength=G+1).tolist())

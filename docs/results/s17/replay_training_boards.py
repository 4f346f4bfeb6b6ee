"""The no-update baseline for `compare_runs.py`: play the training boards of a GRPO run (each step's secrets with
their seeded guesses, read from its metrics.jsonl) greedily with one fixed adapter, and write the games as
`train` records of the same steps. A run with `rl.turn_continue: "greedy"` plays exactly these games at its
start (a test in tests/test_grpo.py checks that the greedy continuation equals play_games at temperature 0),
so this is what its training games would have been with learning rate 0.

Usage: .venv/bin/python docs/results/s17/replay_training_boards.py ADAPTER RUN_METRICS.jsonl OUT.jsonl
"""
import json
import sys
import time

from wordle_mlx.blas import reexec_with_openblas

reexec_with_openblas()

from wordle_mlx.fileio import write_text_atomic  # noqa: E402
from wordle_mlx.game.words import guess_list  # noqa: E402
from wordle_mlx.llm.models import load_model  # noqa: E402
from wordle_mlx.llm.rollout import GameSpec, RolloutConfig, play_games  # noqa: E402

adapter, metrics, out = sys.argv[1:4]
steps = {}
for line in open(metrics):
    d = json.loads(line)
    if d.get("kind") == "train":
        steps[d["step"]] = [(g["secret"], g["guesses"][:g.get("seeded", 0)]) for g in d["games"]]
boards = [(k, secret, seeded) for k in sorted(steps) for secret, seeded in steps[k]]
model, tokenizer = load_model("builtin:gemma-3-270m", adapter)
cfg = RolloutConfig(max_tokens_per_turn=16, completion_batch_size=64).for_adapter(adapter)
start = time.time()
episodes = play_games(model, tokenizer, [GameSpec(secret, list(seeded)) for _, secret, seeded in boards], cfg,
                      frozenset(guess_list()))
records = {}
for (k, secret, seeded), ep in zip(boards, episodes):
    records.setdefault(k, []).append({"secret": secret, "won": bool(ep.won), "guesses": list(ep.state.guesses),
                                      "seeded": len(seeded)})
lines = [json.dumps({"kind": "train", "step": k, "games": games}) for k, games in sorted(records.items())]
write_text_atomic(out, "\n".join(lines) + "\n")
print(f"{len(boards)} boards, {sum(ep.won for ep in episodes)} won, {time.time() - start:.0f} s -> {out}")

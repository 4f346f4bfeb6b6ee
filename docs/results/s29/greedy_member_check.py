"""Check on the real model: in a greedy_return rollout with train_greedy, the greedy member of each group is
played on greedily in a different batch, so its game should be the main (greedy) game itself; this counts
the continuations that differ.
Usage: .venv/bin/python docs/results/s29/greedy_member_check.py docs/results/s29/grpo_return_config.json N"""
import sys

from wordle_mlx.blas import reexec_with_openblas

reexec_with_openblas()
import mlx.core as mx  # noqa: E402

from wordle_mlx.config import load_config
from wordle_mlx.game.rewards import Rewards
from wordle_mlx.game.splits import split_words
from wordle_mlx.game.words import answers, guess_list
from wordle_mlx.llm import grpo_step
from wordle_mlx.llm.generation import BatchedGenerator
from wordle_mlx.llm.rollout import GameSpec
from wordle_mlx.stages import grpo as stage

cfg = load_config(sys.argv[1], stage.GRPOConfig)
n = int(sys.argv[2])
model, tok, _ = stage.load_policy(cfg)
mx.random.seed(0)
rewards = Rewards(cfg.reward, answers(), cfg.rl.max_turns, "turn")
specs = [GameSpec(w) for w in split_words("train")[:n]]
played_on = []
real_play_on = grpo_step.play_on


def recording_play_on(model, tok, games, *args, **kw):
    played_on.extend((g, len(g.episode.turns)) for g in games)
    return real_play_on(model, tok, games, *args, **kw)


grpo_step.play_on = recording_play_on
out = grpo_step.rollout_turn_mode(model, tok, specs, 4, stage.rollout_config(cfg, 1.0, 0), frozenset(guess_list()),
                                  rewards, BatchedGenerator(model, tok), continue_with="greedy", train_greedy=True,
                                  turn_reward="greedy_return")
main_of = {}
for ep in out.episodes:
    for k, t in enumerate(ep.turns):
        main_of[(ep.secret, tuple(t.prompt_tokens + t.completion_tokens))] = (ep, k)
mismatch = checked = 0
for g, n in played_on:                  # n: turns before play_on; turn n - 1 is the reply the branch is for
    t = g.episode.turns[n - 1]
    key = (g.episode.secret, tuple(t.prompt_tokens + t.completion_tokens))
    if key in main_of and main_of[key][1] == n - 1:
        ep, k = main_of[key]
        checked += 1
        mine = [(x.text, x.error) for x in g.episode.turns[n:]]
        theirs = [(x.text, x.error) for x in ep.turns[k + 1:]]
        if mine != theirs:
            mismatch += 1
            print(ep.secret, "after turn", k + 1, "main:", theirs, "branch:", mine)
print(f"continued greedy replies whose game differs from the main game: {mismatch} / {checked}; "
      f"main games won {sum(ep.won for ep in out.episodes)} / {len(out.episodes)}; rollout {out.seconds:.0f} s")

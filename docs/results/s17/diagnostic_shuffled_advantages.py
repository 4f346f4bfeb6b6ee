"""Control run for GRPO: the same training as `wordle-mlx train --config CONFIG`, except that inside every group
the advantages are permuted at random before the update. The update then has the real run's size, its
tokens and its group structure, but no reward signal: what it does to the policy is what the noise of
GRPO's updates alone does. Compare its held-out eval with the real run's (same config, same seeds).

Usage: .venv/bin/python docs/results/s17/diagnostic_shuffled_advantages.py CONFIG RUN_NAME [STEPS [resume]]
(`resume` continues logs/RUN_NAME from its latest checkpoint; the permutations then restart from their seed).
"""
import sys

import numpy as np

from wordle_mlx.blas import reexec_with_openblas

reexec_with_openblas()

from wordle_mlx.config import load_config  # noqa: E402
from wordle_mlx.llm import advantages, grpo_step  # noqa: E402
from wordle_mlx.stages import grpo  # noqa: E402

RNG = np.random.default_rng(12345)
real_group_advantages = advantages.group_advantages


def shuffled_group_advantages(rewards, groups, scale=True, eps=1e-4):
    adv, skipped = real_group_advantages(rewards, groups, scale=scale, eps=eps)
    groups = np.asarray(groups)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        adv[idx] = adv[RNG.permutation(idx)]
    return adv, skipped


grpo_step.group_advantages = shuffled_group_advantages
overrides = {"run_name": sys.argv[2], "overwrite": True, "progress": False}
if len(sys.argv) > 3:
    overrides["training.steps"] = int(sys.argv[3])
if len(sys.argv) > 4 and sys.argv[4] == "resume":
    first = load_config(sys.argv[1], grpo.GRPOConfig)
    overrides.update(overwrite=False, resume=str(grpo.resolve_path(first, first.logs_dir) / sys.argv[2]))
cfg = load_config(sys.argv[1], grpo.GRPOConfig, overrides)
print(grpo.run(cfg))

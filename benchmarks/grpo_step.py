"""One GRPO step, rollout plus update, in free against grammar decoding.

Runs the step `wordle-mlx train` runs with its default settings (G replies per board sampled at temperature 1
plus the greedy reply, which the game goes on with and which joins its group; SGD at 0.02, the gradient
clipped to 1) on the shipped adapter, for the same B boards of train words, once with `free` decoding and its
full-vocabulary log-probs in the update, once with `grammar` decoding and the update's log-softmax over the 26
letters. Each mode starts from the shipped weights. Prints each mode's rollout and update seconds, replies and
trained tokens, and the update's roofline: the multiply-adds it needs at the float32 matmul rate measured in the
same run (the best of 5 rounds before the steps and 5 after them). The update needs each live group's prompt once and each reply's tokens up to its last trained one,
forward through every block and backward (the activations' gradients: the base weights are frozen) through the
blocks whose LoRA trains, plus the head rows the loss scores (26 letters, or the vocabulary in free decoding).
Then `update_roofline_fraction X.XX` for the grammar step (its roofline seconds over its update seconds) and last
`step_speedup X.XX` (free step seconds over grammar). The update is timed after one untimed update of the same
replies from the same weights (a process's first update also allocates its buffers and compiles its kernels).
Usage: python benchmarks/grpo_step.py [--adapter adapters/gemma-3-270m-wordle] [--boards 4] [--generations 8]
       [--train-layers N] [--modes free grammar words]
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
    ap.add_argument("--boards", type=int, default=4)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--train-layers", type=int, default=None, help="only the last N blocks' LoRA trains")
    ap.add_argument("--modes", nargs="+", default=["free", "grammar"], choices=["free", "grammar", "words"])
    args = ap.parse_args()

    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten, tree_unflatten

    from wordle_mlx.runtime.blas import describe_blas
    from wordle_mlx.game.rewards import Rewards
    from wordle_mlx.game.splits import split_words
    from wordle_mlx.game.words import answers, guess_list
    from wordle_mlx.llm.play.generation import BatchedGenerator
    from wordle_mlx.llm.play.prompts import PromptConfig, adapter_prompt
    from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig
    from wordle_mlx.llm.training import rl as grpo
    from wordle_mlx.llm.training.rl import LossSettings
    from wordle_mlx.llm.training.policy import load_policy, start_adapter
    from wordle_mlx.stages.grpo import letter_choices
    from wordle_mlx.stages.grpo_config import ROLLOUT_BATCH, GRPOConfig
    from wordle_mlx.llm.model.logits import text_model
    from wordle_mlx.llm.training.packing import shared_prompt_length

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from decode_roofline import linear_macs, matmul_gflops

    adapter = Path(args.adapter).resolve()
    defaults = GRPOConfig(model={"name": args.model, "adapter": str(adapter)},
                          lora={"train_layers": args.train_layers})
    prompt = adapter_prompt(adapter) or PromptConfig()          # the stage plays the start adapter's prompt
    # trainable LoRA from the adapter, as the stage loads it (the decoding only goes into the adapter config)
    model, tokenizer, _, _ = load_policy(defaults.model, defaults.lora, defaults.run.seed, start_adapter(defaults), prompt, "grammar", False)
    start = [(k, mx.array(v)) for k, v in tree_flatten(model.trainable_parameters())]
    allowed = frozenset(guess_list())
    boards = [GameSpec(w) for w in split_words("train")[:args.boards]]
    rewards = Rewards(defaults.reward.weights(), answers())
    rl, opt = defaults.rl, defaults.optimizer
    print(f"{args.model} + {adapter.name}: one GRPO step, {args.boards} boards x {args.generations} replies + the "
          f"greedy one, BLAS: {describe_blas()}")
    body = text_model(model).model
    block_macs = [linear_macs(layer) for layer in body.layers]
    trained = [bool(tree_flatten(layer.trainable_parameters())) for layer in body.layers]
    vocab = body.args.vocab_size
    before = matmul_gflops(512, body.args.hidden_size, 4 * body.args.hidden_size)

    def needed_flops(items, mode: str) -> float:
        """The update's needed FLOPs (see the module docstring)."""
        seqs, _, _ = grpo.live_sequences(items)
        prompts, reply_tokens, scored = set(), 0, 0
        for q in seqs:
            k = shared_prompt_length(q) or q.mask.index(1)
            prompts.add(tuple(q.tokens[:k]))
            reply_tokens += len(q.tokens) - k
            scored += sum(q.mask)
        tokens = sum(len(p) for p in prompts) + reply_tokens
        per_token = sum(m * (2 if t else 1) for m, t in zip(block_macs, trained))
        head = scored * body.args.hidden_size * (26 if mode != "free" else vocab) * 2   # forward and backward
        return 2 * (tokens * per_token + head)

    seconds, update_fraction, runs = {}, {}, []
    for mode in args.modes:
        model.update(tree_unflatten(start))
        # as the stage's rollout config (stages/grpo.py), in this mode
        cfg = RolloutConfig(temperature=rl.temperature, max_tokens_per_turn=defaults.max_tokens, seed=0,
                            prompt=prompt, decode=mode, completion_batch_size=ROLLOUT_BATCH)
        player = grpo.Player(model, tokenizer, BatchedGenerator(model, tokenizer, mode=mode, words=allowed))
        mx.random.seed(0)
        t0 = time.perf_counter()
        rollout = grpo.rollout(player, boards, cfg, allowed, rewards, args.generations)
        t1_rollout = time.perf_counter()
        settings = grpo.UpdateSettings(
            LossSettings(beta=rl.beta, temperature=rl.temperature, letters=letter_choices(tokenizer, mode, allowed)),
            opt.max_grad_norm, rl.max_tokens_per_microbatch, rl.max_loss_tokens_per_microbatch)
        # one untimed update of the same replies first: a process's first update pays about 1.7 s once
        # (buffers allocated, kernels compiled), which a run's later steps do not
        grpo.policy_update(model, optim.SGD(learning_rate=opt.learning_rate), rollout.items, settings)
        model.update(tree_unflatten(start))
        t1 = time.perf_counter()
        result = grpo.policy_update(model, optim.SGD(learning_rate=opt.learning_rate), rollout.items, settings)
        t2 = time.perf_counter()
        seconds[mode] = (t1_rollout - t0) + (t2 - t1)
        runs.append((mode, t1_rollout - t0, rollout, t2 - t1, result, needed_flops(rollout.items, mode)))
    after = matmul_gflops(512, body.args.hidden_size, 4 * body.args.hidden_size)
    gflops = max(before, after)
    print(f"blocks that train: {sum(trained)} of {len(trained)}; float32 matmul measured {gflops:.0f} GFLOP/s "
          f"({before:.0f} before the steps, {after:.0f} after)")
    for mode, rollout_s, rollout, update_s, result, flops in runs:
        roof = flops / (gflops * 1e9)
        update_fraction[mode] = roof / update_s
        print(f"{mode:8s} rollout {rollout_s:6.1f} s ({len(rollout.replies)} replies, {rollout.tokens_generated} "
              f"tokens)   update {update_s:6.1f} s ({result.trained_tokens} trained tokens, applied "
              f"{result.applied})   step {seconds[mode]:6.1f} s   update roofline {roof:5.1f} s")
    if "grammar" in update_fraction:
        print(f"update_roofline_fraction {update_fraction['grammar']:.2f}")
    if "free" in seconds and "grammar" in seconds:
        print(f"step_speedup {seconds['free'] / seconds['grammar']:.2f}")


if __name__ == "__main__":
    main()

"""The GRPO config's `anchor` section at work (InstructGPT's PPO-ptx): an SFT term added to every GRPO step.

`SFTAnchor` reads an SFT data folder (`wordle-mlx data` or `choice` output), checks that its prompt settings
(`stats.json`) are the ones the rollouts use, tokenizes and buckets `train.jsonl` exactly as `wordle-mlx sft`
does, and for step k returns `anchor.weight` x the gradient of the token-mean cross-entropy of the k-th batch
of a seeded shuffle (and that loss, for the metrics). `grpo.run` passes the gradient to
`grpo_step.policy_update`, which adds it to the GRPO gradient before clipping. With several ranks each keeps
its share of the batch and the gradient is summed over ranks, as in `sft`.
"""

from __future__ import annotations

from ..config import read_json_file, resolve_path
from ..errors import UserError
from ..llm.prompts import PromptConfig
from .grpo_config import GRPOConfig


class SFTAnchor:
    """The `anchor` section at work: batches of an SFT data folder (tokenized and cut into length buckets as
    `wordle-mlx sft` does, shared prefix included), one per step in a seeded shuffle that depends only on the
    step, so a resumed run draws the same ones; `grads(step)` is `weight` x the gradient of their
    token-mean cross-entropy, summed over ranks."""

    def __init__(self, cfg: GRPOConfig, model, tokenizer, prompt, world):
        import mlx.nn as nn

        from ..llm.sft_loss import loss_sum
        from .data import read_sft_jsonl
        from .sft import SFTConfig, make_batches, tokenize
        a = cfg.anchor
        folder = resolve_path(cfg, a.data).resolve()
        path = folder / "train.jsonl"
        if not path.is_file():
            raise UserError(f"anchor.data: {folder} has no train.jsonl (expected a `wordle-mlx data` or `choice` folder)")
        stats = folder / "stats.json"
        shown = read_json_file(stats).get("prompt") if stats.is_file() else None
        try:
            same = shown is None or PromptConfig(**shown) == prompt
        except (TypeError, ValueError) as exc:
            raise UserError(f"anchor.data: {stats}: prompt {shown!r} is not a prompt config "
                            f"({str(exc).splitlines()[0]})") from None
        if not same:
            raise UserError(f"anchor.data: {stats} prompt {shown} differs from the rollout prompt {prompt.model_dump()}")
        layout = SFTConfig(batch_size=a.batch_size)     # the sft stage's padding, length cap and shared prefix
        self.batches = make_batches(tokenize(read_sft_jsonl(path), tokenizer, path), layout, world)
        self.weight, self.seed, self.world = a.weight, a.seed, world
        self.model, self.loss_and_grad = model, nn.value_and_grad(model, loss_sum)

    def grads(self, step: int):
        from mlx.utils import tree_map

        from .sft import batch_at, mean_gradient
        model = self.model
        batch = self.batches[batch_at(step - 1, len(self.batches), self.seed)]
        model.train()
        grads, total, count, _ = mean_gradient(model, self.loss_and_grad, [batch], self.world)
        model.eval()
        return tree_map(lambda g: self.weight * g, grads), total / max(count, 1.0)

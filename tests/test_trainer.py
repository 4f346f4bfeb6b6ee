"""The trainer as a function (`llm/training/trainer.py`): any loss function and any iterator of batches train, the
gradient accumulation over micro-batches equals one batch of them all, a batch with nothing to train is recorded
without an update, and non-finite steps are skipped and then stop the run."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten

from wordle_mlx.llm.model.lora import apply_lora, lora_parameters
from wordle_mlx.llm.model.models import load_model
from wordle_mlx.llm.training.distributed import World
from wordle_mlx.llm.training.trainer import (Batch, NonFiniteStop, TrainingArgs, accumulate_gradients, train,
                                             train_step)
from wordle_mlx.storage.metrics import read_jsonl
from . import assert_f32_close


def tiny_policy():
    mx.random.seed(0)
    model, _ = load_model("builtin:tiny-random")
    apply_lora(model, -1, lora_parameters(4, 10.0, 0.0, None))
    return model


def next_token_loss(model, inputs, targets):
    """A plain summed next-token cross-entropy, as a user of mlx-lm would write one."""
    logits = model(inputs).astype(mx.float32)
    return nn.losses.cross_entropy(logits, targets, reduction="sum"), {"tokens": mx.array(targets.size, mx.float32)}


def rows(seed: int, n: int, length: int = 6):
    tokens = mx.random.randint(3, 60, (n, length + 1), key=mx.random.key(seed))
    return tokens[:, :-1], tokens[:, 1:]


class Accumulation(unittest.TestCase):
    def test_micro_batches_equal_one_batch(self):
        model = tiny_policy()
        loss_and_grad = nn.value_and_grad(model, next_token_loss)
        inputs, targets = rows(1, 6)
        whole, loss, stats = accumulate_gradients(model, loss_and_grad, Batch([(inputs, targets)], 36.0), World())
        parts = Batch([(inputs[:2], targets[:2]), (inputs[2:5], targets[2:5]), (inputs[5:], targets[5:])], 36.0)
        split, split_loss, split_stats = accumulate_gradients(model, loss_and_grad, parts, World())
        self.assertEqual((stats, split_stats), ({"tokens": 36.0}, {"tokens": 36.0}))
        assert_f32_close(self, split_loss, loss)
        for (name, a), (_, b) in zip(tree_flatten(whole), tree_flatten(split)):
            scale = mx.abs(a).max().item()
            self.assertLessEqual(mx.abs(a - b).max().item(), 1e-5 * scale, name)

    def test_no_count_keeps_the_sum(self):
        model = tiny_policy()
        loss_and_grad = nn.value_and_grad(model, next_token_loss)
        inputs, targets = rows(2, 2)
        summed, total, _ = accumulate_gradients(model, loss_and_grad, Batch([(inputs, targets)]), World())
        mean, avg, _ = accumulate_gradients(model, loss_and_grad, Batch([(inputs, targets)], 12.0), World())
        assert_f32_close(self, total / 12.0, avg)
        a, b = tree_flatten(summed)[0][1], tree_flatten(mean)[0][1]
        self.assertLessEqual(mx.abs(a / 12.0 - b).max().item(), 1e-6 * max(mx.abs(b).max().item(), 1e-12))

    def test_nothing_to_train_is_no_update(self):
        model = tiny_policy()
        before = {k: mx.array(v) for k, v in tree_flatten(model.trainable_parameters())}
        fields = train_step(model, optim.SGD(learning_rate=1.0), nn.value_and_grad(model, next_token_loss),
                            Batch([], trainable=False), 1.0, World())
        self.assertEqual((fields["applied"], fields["finite"], fields["loss"]), (False, True, 0.0))
        for k, v in tree_flatten(model.trainable_parameters()):
            self.assertTrue(mx.array_equal(v, before[k]).item(), k)


class Loop(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def args(self, name: str, steps: int, **extra) -> TrainingArgs:
        return TrainingArgs(steps=steps, run_dir=Path(self.tmp.name) / name, adapter_config={"fine_tune_type": "lora"},
                            config={"run": {"name": name}}, progress=False, **extra)

    def test_any_loss_and_batches(self):
        """A user's own loss and a plain list of batches: the loss falls, every step and validation is logged, the
        adapters are saved, and the callbacks see what the metrics file holds."""
        model = tiny_policy()
        inputs, targets = rows(3, 4)
        batches = iter([Batch([(inputs, targets)], 24.0, {"tokens": 24})] * 8)
        seen = []

        class Recorder:
            def on_train(self, record):
                seen.append(("train", record["step"]))

            def on_valid(self, record):
                seen.append(("valid", record["step"]))

        def evaluate(step):
            model.eval()
            loss, _ = next_token_loss(model, inputs, targets)
            return {"val_loss": loss.item() / 24.0}

        result = train(model, optim.Adam(learning_rate=1e-2), next_token_loss, batches,
                       self.args("toy", 8, steps_per_eval=4), evaluate, callbacks=[Recorder()])
        records = [r for _, r in read_jsonl(Path(self.tmp.name) / "toy" / "metrics.jsonl")]
        steps = [r for r in records if r["kind"] == "train"]
        self.assertEqual([r["step"] for r in steps], list(range(1, 9)))
        self.assertLess(steps[-1]["loss"], steps[0]["loss"])
        self.assertEqual([r["step"] for r in records if r["kind"] == "valid"], [4, 8])
        self.assertEqual(seen, [("train", s) for s in range(1, 5)] + [("valid", 4)] +
                         [("train", s) for s in range(5, 9)] + [("valid", 8)])
        self.assertTrue((Path(self.tmp.name) / "toy" / "adapters" / "adapters.safetensors").is_file())
        self.assertEqual((result["step"], result["stopped"]), (8, "finished"))

    def test_nonfinite_steps_skip_then_stop(self):
        model = tiny_policy()
        before = {k: mx.array(v) for k, v in tree_flatten(model.trainable_parameters())}
        inputs, targets = rows(4, 2)

        def nan_loss(model, inputs, targets):
            loss, stats = next_token_loss(model, inputs, targets)
            return loss * mx.array(float("nan")), stats

        with self.assertRaisesRegex(NonFiniteStop, "stopping at step 3"):
            train(model, optim.SGD(learning_rate=1.0), nan_loss, iter([Batch([(inputs, targets)], 12.0)] * 5),
                  self.args("nan", 5))
        for k, v in tree_flatten(model.trainable_parameters()):
            self.assertTrue(mx.array_equal(v, before[k]).item(), k)
        steps = [r for _, r in read_jsonl(Path(self.tmp.name) / "nan" / "metrics.jsonl") if r["kind"] == "train"]
        self.assertEqual([(r["applied"], r["nonfinite_skips"]) for r in steps], [(False, 1), (False, 2), (False, 3)])


if __name__ == "__main__":
    unittest.main()

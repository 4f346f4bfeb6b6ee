"""Tests for GRPO: advantages, packing and masks, the loss, learning a toy reward, NaN handling, exact resume,
validation from step 0 with the best adapter kept, the decoding the adapter records."""

from __future__ import annotations

import json
import math
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import numpy as np

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from wordle_mlx.config import validate_config
from wordle_mlx.errors import UserError
from wordle_mlx.llm.training import packing as grpo_loss_module
from wordle_mlx.llm.training import rl
from wordle_mlx.llm.play.episode import TokenSequence
from wordle_mlx.llm.play.generation import BatchedGenerator, SamplingConfig
from wordle_mlx.llm.training.advantages import group_advantages
from wordle_mlx.llm.training.rl import LossSettings, grpo_loss
from wordle_mlx.llm.training.packing import averaging_weights, batch_arrays, pack_batch
from wordle_mlx.llm.model.lora import lora_disabled
from wordle_mlx.llm.model.logits import selected_logprobs
from wordle_mlx.llm.training.rl import Player, ScoredItem, UpdateSettings, policy_update
from wordle_mlx.llm.training.policy import load_policy, start_adapter
from wordle_mlx.llm.training.trainer import NonFiniteStop, make_optimizer
from wordle_mlx.llm.play.prompts import PromptConfig
from wordle_mlx.llm.play.rollout import RolloutConfig
from wordle_mlx.llm.model.lora import apply_lora, lora_parameters
from wordle_mlx.llm.model.models import load_model
from wordle_mlx.storage.metrics import read_jsonl
from wordle_mlx.stages import grpo as stage
from wordle_mlx.stages.plot import PlotConfig
from wordle_mlx.stages.plot import run as plot_run
from wordle_mlx.game.rewards import RewardWeights, Rewards
from wordle_mlx.game.words import answers, guess_list
from wordle_mlx.llm.play.rollout import GameSpec, play_games
from . import assert_f32_close


def tiny_policy(seed: int = 0):
    mx.random.seed(seed)
    model, tok = load_model("builtin:tiny-random")
    apply_lora(model, -1, lora_parameters(4, 10.0, 0.0, None))
    return model, tok


def sample_items(model, tok, prompt, groups: int, g: int, max_tokens: int, reward_fn):
    gen = BatchedGenerator(model, tok)
    items = []
    for group in range(groups):
        for c in gen([prompt] * g, SamplingConfig(temperature=1.0, max_tokens_per_turn=max_tokens)):
            seq = TokenSequence(list(prompt) + c.tokens, [0] * len(prompt) + [1] * len(c.tokens),
                                [0.0] * len(prompt) + c.logprobs)
            items.append(ScoredItem([seq], group, float(reward_fn(c.tokens)), {}))
    return items


def stage_config(logs: str, optimizer: dict | None = None, **run) -> stage.GRPOConfig:
    data = {"model": {"name": "builtin:tiny-random", "adapter": None}, "lora": {"rank": 4, "scale": 10.0},
            "optimizer": {"name": "adamw", "min_lr_ratio": 0.0, "learning_rate": 1e-3, **(optimizer or {})},
            "run": {"steps": 3, "save_every": 0, "seed": 3, "logs_dir": logs, "name": "run", "progress": False, **run},
            "rl": {"batch_prompts": 2, "num_generations": 3}, "max_tokens": 8, "decode": "free",
            "reward": {"early": 1.2}, "validation": {"every": 0}}
    return validate_config(data, stage.GRPOConfig, "test")


def rollout_config(temperature: float = 1.0, seed: int = 0) -> RolloutConfig:
    return RolloutConfig(temperature=temperature, max_tokens_per_turn=8, seed=seed, prompt=PromptConfig(),
                         decode="free")


REAL_ROLLOUT = rl.rollout


def spread_rollout(*args, **kwargs):
    """The real rollout, with rewards nudged apart so that no group has zero variance (a random model's
    replies are all format errors, which score alike)."""
    out = REAL_ROLLOUT(*args, **kwargs)
    for i, item in enumerate(out.items):
        item.reward += 0.01 * i
    return out


def train_records(run_dir: Path) -> list[dict]:
    return [r for _, r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


class Advantages(unittest.TestCase):
    def test_normalised_centred_and_skipped(self):
        adv, skipped = group_advantages([1.0, 3.0, 2.0, 2.0, 5.0, 5.0], [0, 0, 1, 1, 2, 2])
        self.assertEqual(skipped, 2)
        np.testing.assert_allclose(adv, [-1.0 / (1.0 + 1e-4), 1.0 / (1.0 + 1e-4), 0, 0, 0, 0], rtol=1e-9)

    def test_equal_floats_are_exactly_zero(self):
        adv, skipped = group_advantages([0.1, 0.1, 0.1], [4, 4, 4])
        self.assertEqual((adv.tolist(), skipped), ([0.0, 0.0, 0.0], 1))

    def test_nonfinite_reward_raises(self):
        with self.assertRaises(ValueError):
            group_advantages([1.0, float("nan")], [0, 0])


class Packing(unittest.TestCase):
    def test_positions_targets_masks(self):
        a = TokenSequence([5, 6, 7, 8, 9], [0, 0, 1, 1, 1], [0, 0, -0.1, -0.2, -0.3])
        b = TokenSequence([5, 6, 10, 11], [0, 0, 0, 1], [0, 0, 0, -0.4])
        w = averaging_weights([3, 1])
        batch = pack_batch([a, b], [0.5, -1.0], w)
        self.assertEqual(batch.inputs.shape, (2, 4))
        self.assertEqual(batch.inputs.tolist(), [[5, 6, 7, 8], [5, 6, 10, 0]])
        self.assertEqual(batch.positions.tolist(), [1, 2, 3, 4 + 2])       # input position t predicts t + 1
        self.assertEqual(batch.targets.tolist(), [7, 8, 9, 11])
        np.testing.assert_allclose(batch.old_logprobs, [-0.1, -0.2, -0.3, -0.4])
        np.testing.assert_allclose(batch.advantages, [0.5, 0.5, 0.5, -1.0])
        np.testing.assert_allclose(batch.weights, [0.25] * 4)

    def test_episode_sequences_mask_only_model_tokens(self):
        from wordle_mlx.game.state import GameState
        from wordle_mlx.llm.play.episode import Episode, Turn

        ep = Episode("crane", [], GameState("crane"), [Turn([1, 2, 3], [4, 5], [-0.1, -0.2], "", None, "missing_guess"),
                                                      Turn([1, 2, 6, 7], [8], [-0.3], "", None, "missing_guess")])
        batch = pack_batch(ep.token_sequences(), [1.0, 1.0], averaging_weights([2, 1]))
        self.assertEqual(batch.targets.tolist(), [4, 5, 8])


class LossOnTinyModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model, cls.tok = tiny_policy(0)
        cls.prompt = cls.tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)

    def test_rollout_logprobs_match_recomputed(self):
        mx.random.seed(1)
        items = sample_items(self.model, self.tok, self.prompt, 1, 4, 6, lambda t: 0.0)
        seqs = [it.sequences[0] for it in items]
        batch = pack_batch(seqs, [0.0] * 4, averaging_weights([sum(s.mask) for s in seqs]))
        arrays = batch_arrays(batch)
        new = selected_logprobs(self.model, arrays["inputs"], arrays["positions"], arrays["targets"], 1.0)
        np.testing.assert_allclose(np.array(new), batch.old_logprobs, atol=2e-4)

    def test_gradient_is_zero_when_rewards_are_equal(self):
        mx.random.seed(2)
        items = sample_items(self.model, self.tok, self.prompt, 2, 4, 6, lambda t: 0.0)
        for it in items:
            it.reward = 0.3 if it.group == 0 else 0.7          # equal within every group
        adv, skipped = group_advantages([it.reward for it in items], [it.group for it in items])
        self.assertEqual(skipped, 2)
        seqs = [it.sequences[0] for it in items]
        arrays = batch_arrays(pack_batch(seqs, adv.tolist(), averaging_weights([sum(s.mask) for s in seqs])))
        import mlx.nn as nn

        (loss, _), grads = nn.value_and_grad(self.model, lambda a: grpo_loss(self.model, a, LossSettings()))(arrays)
        self.assertEqual(loss.item(), 0.0)
        leaves = [v for _, v in tree_flatten(grads)]
        self.assertTrue(leaves)
        self.assertTrue(all(float(mx.abs(v).max()) == 0.0 for v in leaves))
        before = {k: np.array(v) for k, v in tree_flatten(self.model.trainable_parameters())}
        result = policy_update(self.model, optim.Adam(learning_rate=1e-2), items, UpdateSettings(LossSettings()))
        self.assertEqual((result.applied, result.skipped_groups, result.groups, result.trained_tokens), (False, 2, 2, 0))
        after = dict(tree_flatten(self.model.trainable_parameters()))
        self.assertTrue(all(np.array_equal(before[k], np.array(after[k])) for k in before))

    def test_shared_prompt_update_equals_plain_packing(self):
        """Replies to one prompt, packed with the prompt run once, give the plain packing's log-probs, loss,
        gradient and update, including the reference term (beta > 0) and a second prompt's group."""
        mx.random.seed(7)
        other = self.tok.apply_chat_template([{"role": "user", "content": "a longer second prompt here"}],
                                             add_generation_prompt=True)
        items = sample_items(self.model, self.tok, self.prompt, 2, 4, 6, lambda t: len(t) + t[0] % 3)
        more = sample_items(self.model, self.tok, other, 1, 3, 5, lambda t: t[-1] % 5)
        for it in more:
            it.group = 2
        items += more
        seqs = [it.sequences[0] for it in items]
        groups, rest = grpo_loss_module.shared_prompt_groups(seqs, 256)
        self.assertEqual((sorted(len(g) for g in groups), rest), ([3, 8], []))
        shared = grpo_loss_module.pack_shared_batch([seqs[i] for i in groups[0]], [0.5] * len(groups[0]),
                                                    averaging_weights([sum(seqs[i].mask) for i in groups[0]]))
        arrays = batch_arrays(shared)
        new = selected_logprobs(self.model, arrays["inputs"], arrays["positions"], arrays["targets"], 1.0,
                                arrays["prefix"])
        np.testing.assert_allclose(np.array(new), shared.old_logprobs, atol=2e-4)
        # lora_b starts at 0, so give the adapters values: the reference (LoRA off) then differs
        for _, m in self.model.named_modules():
            if hasattr(m, "lora_b"):
                m.lora_b = mx.random.normal(m.lora_b.shape) * 0.05
        start = {k: mx.array(v) for k, v in tree_flatten(self.model.trainable_parameters())}
        results, params = [], []
        for share in (False, True):
            self.model.update(tree_unflatten(list(start.items())))
            settings = UpdateSettings(LossSettings(beta=0.05), share_prompts=share)
            results.append(policy_update(self.model, optim.SGD(learning_rate=0.1), items, settings))
            params.append({k: np.array(v) for k, v in tree_flatten(self.model.trainable_parameters())})
        plain, shared_result = results
        # another packing sums in another order: equal up to float32 rounding (the loss, a sum of terms of size
        # about 1 from normalised advantages, can cancel to near 0)
        assert_f32_close(self, plain.loss, shared_result.loss, scale=1.0, msg="loss")
        assert_f32_close(self, plain.grad_norm, shared_result.grad_norm, rtol=1e-4, msg="grad_norm")
        assert_f32_close(self, plain.kl, shared_result.kl, msg="kl")
        self.assertEqual(plain.trained_tokens, shared_result.trained_tokens)
        for k in params[0]:
            np.testing.assert_allclose(params[0][k], params[1][k], atol=1e-5, err_msg=k)

    def test_reference_is_model_with_lora_off(self):
        model, tok = tiny_policy(5)
        for _, m in model.named_modules():
            if hasattr(m, "lora_b"):
                m.lora_b = mx.random.normal(m.lora_b.shape) * 0.1
        inputs = mx.array([self.prompt])
        with_lora = model(inputs)
        with lora_disabled(model) as n:
            base = model(inputs)
        self.assertGreater(n, 0)
        plain, _ = load_model("builtin:tiny-random")
        np.testing.assert_allclose(np.array(base), np.array(plain(inputs)), atol=1e-5)
        self.assertGreater(float(mx.abs(with_lora - base).max()), 1e-3)
        np.testing.assert_allclose(np.array(model(inputs)), np.array(with_lora), atol=1e-6)   # scale restored


class ToyReward(unittest.TestCase):
    def test_reward_rises(self):
        """Reward = share of the first 4 tokens that are lowercase letters (~7% for the random model)."""
        model, tok = tiny_policy(0)
        letters = {tok.get_vocab()[c] for c in "abcdefghijklmnopqrstuvwxyz"}
        prompt = tok.apply_chat_template([{"role": "user", "content": "say letters"}], add_generation_prompt=True)
        opt = optim.Adam(learning_rate=3e-3)
        means = []
        for step in range(24):
            mx.random.seed(100 + step)
            items = sample_items(model, tok, prompt, 2, 8, 4, lambda t: sum(x in letters for x in t) / 4)
            means.append(np.mean([it.reward for it in items]))
            policy_update(model, opt, items, UpdateSettings(LossSettings(beta=0.01)))
        self.assertLess(np.mean(means[:3]), 0.3)
        self.assertGreater(np.mean(means[-5:]), 0.7)


class Stage(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def test_metrics_checkpoints_and_adapters(self):
        cfg = stage_config(self.tmp.name, save_every=2)
        result = stage.run(cfg)
        run_dir = Path(self.tmp.name) / "run"
        recs = train_records(run_dir)
        self.assertEqual([r["step"] for r in recs], [1, 2, 3])
        for key in ("lr", "loss", "kl", "grad_norm", "reward_mean", "reward_std", "win_rate", "mean_guesses",
                    "format_error_rate", "invalid_rate", "repeat_rate", "skipped_groups", "nonfinite_skips",
                    "tokens_generated", "rollout_seconds", "update_seconds", "peak_memory_gb"):
            self.assertIn(key, recs[0])
        self.assertEqual(set(recs[0]["rewards"]), {"win", "early", "format", "valid", "consistent", "info_gain",
                                                  "repeat", "length"})
        self.assertEqual(len(recs[0]["games"]), 2)                    # one game per board
        turns = [sum(len(g["guesses"]) for g in r["games"]) for r in recs]
        self.assertTrue(all(r["groups"] >= 2 for r in recs))          # a group per turn of each game
        self.assertTrue(all(0 <= r["skipped_groups"] <= r["groups"] for r in recs), turns)
        self.assertTrue((run_dir / "checkpoints" / "step_000002" / "optimizer.safetensors").is_file())
        self.assertTrue((run_dir / "adapters" / "adapters.safetensors").is_file())
        self.assertEqual(result["step"], 3)
        load_model("builtin:tiny-random", adapter_path=run_dir / "adapters")     # loads as an mlx-lm adapter

    def test_validation_from_step_0_keeps_the_best_adapter(self):
        """Words decoding: the start adapter is validated as step 0, then every 2 steps and at the end; the adapter of
        the pass with the most wins (scripted here: step 2) is adapters_best/ and the run's adapters/; each step logs
        its share of skipped groups; the adapter records words decoding, tags untrained."""
        cfg = stage_config(self.tmp.name, steps=3, save_every=2)
        cfg = cfg.model_copy(update={"decode": "words",
                                     "validation": cfg.validation.model_copy(update={"every": 2, "games": 3})})
        real = stage.validation_record
        scripted = iter([0.1, 0.5, 0.3])                 # steps 0, 2 and 3

        def validate(*args):
            rec = real(*args)
            self.assertEqual(len(rec["games"]), 3)
            self.assertEqual((rec["invalid_rate"], rec["format_error_rate"], rec["repeat_rate"]), (0.0, 0.0, 0.0))
            return {**rec, "win_rate": next(scripted)}

        with mock.patch.object(stage, "validation_record", validate):
            result = stage.run(cfg)
        run_dir = Path(self.tmp.name) / "run"
        valid = [r for _, r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "valid"]
        self.assertEqual([(r["step"], r["best"]) for r in valid], [(0, True), (2, True), (3, False)])
        self.assertEqual((result["best_valid_step"], result["adapters_are"]), (2, "best"))
        for rec in train_records(run_dir):
            self.assertEqual(rec["skipped_group_share"], rec["skipped_groups"] / rec["groups"])
        weights = lambda folder: (folder / "adapters.safetensors").read_bytes()   # noqa: E731
        self.assertEqual(weights(run_dir / "adapters"), weights(run_dir / "adapters_best"))
        self.assertEqual(weights(run_dir / "adapters"), weights(run_dir / "checkpoints" / "step_000002"))
        acfg = json.loads((run_dir / "adapters" / "adapter_config.json").read_text())
        self.assertEqual((acfg["decode"], acfg["trained_free"]), ("words", False))
        with mock.patch("sys.stdout"):                   # `wordle-mlx plot` draws the validation curve
            files = plot_run(PlotConfig(file=str(run_dir / "metrics.jsonl"), out=str(run_dir / "plots")))["files"]
        self.assertIn("validation.png", [Path(f).name for f in files])

    def test_validation_games_are_evals_boards(self):
        """`validation.history`: the empty board, the boards `eval --split valid --history seeded --seed 0` plays,
        or both, each kind in the words' order."""
        from wordle_mlx.game.solver import Solver
        from wordle_mlx.stages.pattern_table import load_table
        from wordle_mlx.stages.evaluate import EvalConfig, game_specs
        solver = Solver(load_table(show_progress=False))
        words = stage.split_words("valid")[:12]
        evals = game_specs(EvalConfig(split="valid", history="seeded", seed=0, games=12), solver)
        self.assertEqual(list(stage.validation_games(words, "none", solver)), ["empty"])
        both = stage.validation_games(words, "both", solver)
        self.assertEqual(list(both), ["empty", "seeded"])
        self.assertEqual([(g.secret, list(g.seeded_guesses)) for g in both["empty"]], [(w, []) for w in words])
        self.assertEqual([(g.secret, list(g.seeded_guesses)) for g in both["seeded"]],
                         [(g.secret, list(g.seeded_guesses)) for g in evals])
        self.assertTrue(any(g.seeded_guesses for g in both["seeded"]))
        self.assertEqual(stage.validation_games(words, "seeded", solver)["seeded"], both["seeded"])

    def test_validation_from_both_boards_counts_every_game(self):
        """With history "both" a validation pass plays each word twice; its win rate is over all the games and
        each kind's win rate is logged beside it."""
        cfg = stage_config(self.tmp.name, steps=1)
        cfg = cfg.model_copy(update={"validation": cfg.validation.model_copy(
            update={"every": 1, "games": 3, "history": "both"})})
        stage.run(cfg)
        valid = [r for _, r in read_jsonl(Path(self.tmp.name) / "run" / "metrics.jsonl") if r["kind"] == "valid"]
        self.assertEqual([r["step"] for r in valid], [0, 1])
        for rec in valid:
            self.assertEqual(len(rec["games"]), 6)
            wins = sum(bool(g["won"]) for g in rec["games"])
            self.assertEqual(rec["win_rate"], wins / 6)
            self.assertAlmostEqual(rec["win_rate"], (rec["win_rate_empty"] + rec["win_rate_seeded"]) / 2,
                                   delta=1e-12)
        from wordle_mlx.plots.charts import validation_chart
        from wordle_mlx.plots.runlog import load_run
        fig = validation_chart(load_run(Path(self.tmp.name) / "run" / "metrics.jsonl"), 5)
        labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
        self.assertEqual(sum(label.startswith(("empty boards", "seeded boards")) for label in labels), 2, labels)

    def test_nonfinite_loss_is_skipped_then_stops(self):
        def nan_loss(model, arrays, settings, ref=None):
            loss, stats = grpo_loss(model, arrays, settings, ref)
            return loss * float("nan"), stats

        cfg = stage_config(self.tmp.name, steps=5)
        run_dir = Path(self.tmp.name) / "run"
        with mock.patch.object(rl, "grpo_loss", nan_loss), \
                mock.patch.object(rl, "rollout", spread_rollout):
            with self.assertRaisesRegex(NonFiniteStop, "not finite 3 steps in a row"):
                stage.run(cfg)
        recs = train_records(run_dir)
        self.assertEqual([r["nonfinite_skips"] for r in recs], [1, 2, 3])
        self.assertTrue((run_dir / "checkpoints" / "step_000003" / "adapters.safetensors").is_file())
        saved = mx.load(str(run_dir / "checkpoints" / "step_000003" / "adapters.safetensors"))
        model, _ = tiny_policy(0)
        fresh = {k: v for k, v in tree_flatten(model.trainable_parameters()) if k.endswith("lora_b")}
        self.assertTrue(all(float(mx.abs(saved[k]).max()) == 0.0 for k in fresh))      # no update was applied

    def test_resume_gives_the_same_next_step(self):
        one_board = {"rl": {"batch_prompts": 1, "num_generations": 3}}
        uninterrupted = Path(self.tmp.name) / "a"
        with mock.patch.object(rl, "rollout", spread_rollout):
            stage.run(stage_config(str(uninterrupted), steps=2).model_copy(update=config_part(one_board)))
        expected = train_records(uninterrupted / "run")[1]

        calls = {"n": 0}
        def interrupt_third(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
            return spread_rollout(*args, **kwargs)

        logs = Path(self.tmp.name) / "b"
        with mock.patch.object(rl, "rollout", interrupt_third):
            result = stage.run(stage_config(str(logs), steps=2).model_copy(update=config_part(one_board)))
        self.assertEqual((result["step"], result["stopped"]), (1, "interrupted"))
        cfg = stage_config(str(logs), steps=2, resume=str(logs / "run")).model_copy(update=config_part(one_board))
        with mock.patch.object(rl, "rollout", spread_rollout):
            stage.run(cfg)
        got = train_records(logs / "run")
        self.assertEqual([r["step"] for r in got], [1, 2])
        self.assertNotEqual(expected["loss"], 0.0)
        for key in ("games", "reward_mean", "rewards", "tokens_generated", "lr"):
            self.assertEqual(got[1][key], expected[key], key)
        for key in ("loss", "grad_norm"):
            assert_f32_close(self, got[1][key], expected[key], msg=key)
        runs = [r for _, r in read_jsonl(logs / "run" / "metrics.jsonl") if r["kind"] == "run"]
        self.assertEqual([r["resumed_from_step"] for r in runs], [None, 1])

    def test_rollout_groups_are_the_replies_to_one_board_with_the_greedy_one(self):
        """Each group is the G samples plus the greedy reply (member G + 1, the reply the game plays on with),
        scored like the samples; the sampled-reply statistics count only the G samples."""
        model, tok = tiny_policy(0)
        rewards = Rewards(RewardWeights(early=1.2), answers())
        specs = [GameSpec("crane"), GameSpec("pious", ["slate"])]
        allowed = frozenset(guess_list())
        out = rl.rollout(Player(model, tok, BatchedGenerator(model, tok)), specs, rollout_config(1.0, 3),
                                allowed, rewards, 4)
        self.assertEqual(len(out.episodes), 2)
        played = [t for ep in out.episodes for t in ep.turns]
        self.assertEqual(len(out.items), 5 * len(played))
        self.assertEqual(len(out.replies), 4 * len(played))
        members = {}
        for item in out.items:
            self.assertEqual(len(item.sequences), 1)
            members.setdefault(item.group, []).append(item)
        self.assertEqual(sorted(len(m) for m in members.values()), [5] * len(played))
        greedy_members = {(tuple(m[-1].sequences[0].tokens)) for m in members.values()}
        self.assertEqual(greedy_members, {tuple(t.prompt_tokens + t.completion_tokens) for t in played})
        for m in members.values():
            seq = m[-1].sequences[0]
            self.assertEqual(len(seq.logprobs), len(seq.tokens))
            self.assertTrue(all(math.isfinite(x) and x <= 0 for x in seq.logprobs))

    def test_rollout_plays_the_games_greedy_eval_plays(self):
        """Every trajectory is the game greedy evaluation plays (same replies, errors included), while the G
        replies per turn are still sampled at the rollout temperature."""
        model, tok = tiny_policy(0)
        rcfg = rollout_config(1.0, 3)
        rewards = Rewards(RewardWeights(early=1.2), answers())
        specs = [GameSpec("crane"), GameSpec("pious", ["slate"]), GameSpec("shown")]
        allowed = frozenset(guess_list())
        out = rl.rollout(Player(model, tok, BatchedGenerator(model, tok)), specs, rcfg, allowed, rewards, 4)
        greedy = play_games(model, tok, specs, rcfg.model_copy(update={"temperature": 0.0}), allowed,
                            generate_fn=BatchedGenerator(model, tok))
        self.assertEqual([[(t.completion_tokens, t.error) for t in ep.turns] for ep in out.episodes],
                         [[(t.completion_tokens, t.error) for t in ep.turns] for ep in greedy])
        self.assertEqual(len(out.items), 5 * sum(len(ep.turns) for ep in greedy))
        played = {tuple(t.completion_tokens) for ep in greedy for t in ep.turns}
        sampled = {tuple(t.completion_tokens) for t in out.replies}
        self.assertTrue(sampled - played, "the group replies should be samples, not the greedy replies")

    def test_sgd_moves_the_weights_by_the_learning_rate_times_the_clipped_gradient(self):
        """optimizer 'sgd': one step moves the LoRA weights by exactly lr * min(grad_norm, max_grad_norm), in norm
        (AdamW would move every weight by about lr); its state is checkpointed like AdamW's moments."""
        cfg = stage_config(self.tmp.name, steps=1, save_every=1, optimizer={
            "name": "sgd", "learning_rate": 0.05, "min_lr_ratio": 1.0, "max_grad_norm": 0.5})
        start = dict(tree_flatten(load_policy(cfg.model, cfg.lora, cfg.run.seed, start_adapter(cfg), PromptConfig(), "free", False)[0].trainable_parameters()))
        with mock.patch.object(rl, "rollout", spread_rollout):
            stage.run(cfg)
        run_dir = Path(self.tmp.name) / "run"
        (rec,) = train_records(run_dir)
        self.assertGreater(rec["grad_norm"], 0.0)
        after = mx.load(str(run_dir / "adapters" / "adapters.safetensors"))
        moved = math.sqrt(sum(float(((after[k] - start[k]) ** 2).sum()) for k in start))
        assert_f32_close(self, moved, 0.05 * min(rec["grad_norm"], 0.5), rtol=1e-4)   # a norm of float32 differences
        state = mx.load(str(run_dir / "checkpoints" / "step_000001" / "optimizer.safetensors"))
        self.assertEqual({k.rsplit(".", 1)[1] for k in state if k != "step" and k != "learning_rate"}, {"v"})
        self.assertIsInstance(make_optimizer(cfg.optimizer, cfg.run.steps)[0], optim.SGD)
        adamw = make_optimizer(stage_config(self.tmp.name).optimizer, 3)[0]     # no decay: the config has none
        self.assertEqual((type(adamw), adamw.weight_decay), (optim.AdamW, 0.0))

    def test_old_fields_are_unknown_fields_in_one_line(self):
        for data, message in (({"training": {"steps": 3}}, 'training: unknown field (got {"steps": 3})'),
                              ({"rl": {"mode": "episode"}}, "rl.mode: unknown field (got 'episode')"),
                              ({"game_eval": {"every": 2}}, 'game_eval: unknown field (got {"every": 2})'),
                              ({"validation": {"keep": "best"}}, "validation.keep: unknown field (got 'best')"),
                              ({"model": {"start_adapter": "x"}}, "model.start_adapter: unknown field (got 'x')")):
            with self.subTest(data=data), self.assertRaises(UserError) as ctx:
                validate_config(data, stage.GRPOConfig, "x.json")
            self.assertTrue(str(ctx.exception).startswith(f"x.json: {message}"), str(ctx.exception))
            self.assertNotIn("\n", str(ctx.exception))


def config_part(data: dict) -> dict:
    """Sections of a GRPO config, validated, to model_copy into another."""
    cfg = validate_config(data, stage.GRPOConfig, "test")
    return {k: getattr(cfg, k) for k in data}


class StartFromAdapter(unittest.TestCase):
    def test_sft_dropout_is_replaced_by_the_grpo_setting(self):
        from wordle_mlx.llm.model.lora import adapter_config, save_adapters
        with tempfile.TemporaryDirectory() as tmp:
            model, _ = load_model("builtin:tiny-random")
            params = lora_parameters(4, 10.0, 0.3, None)
            apply_lora(model, -1, params)
            save_adapters(Path(tmp) / "sft", model, adapter_config(-1, params, "builtin:tiny-random"))
            cfg = stage_config(tmp)
            cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"adapter": str(Path(tmp) / "sft")})})
            policy, _, acfg, _ = load_policy(cfg.model, cfg.lora, cfg.run.seed, start_adapter(cfg), PromptConfig(), "free", False)
            layers = [m for _, m in policy.named_modules() if hasattr(m, "lora_a")]
            self.assertTrue(layers)
            self.assertTrue(all(m.dropout._p_1 == 1.0 for m in layers))    # keep probability 1: no dropout
            self.assertEqual(acfg["lora_parameters"]["dropout"], 0.0)
            self.assertEqual(acfg["lora_parameters"]["rank"], 4)

    def test_train_layers_updates_only_the_last_blocks_and_saves_every_lora_weight(self):
        """lora.train_layers 1: the last block's LoRA weights move, the others stay bitwise as the adapter had
        them, and the saved adapter (and checkpoint) still holds all of them; resuming restores the same split."""
        from wordle_mlx.llm.model.lora import adapter_config, save_adapters
        with tempfile.TemporaryDirectory() as tmp:
            model, _ = tiny_policy(7)
            # a started adapter: nonzero lora_b everywhere, so the frozen blocks' values are not trivially zero
            model.update(tree_unflatten([(k, mx.random.normal(v.shape) * 0.01)
                                         for k, v in tree_flatten(model.trainable_parameters()) if "lora_b" in k]))
            save_adapters(Path(tmp) / "sft", model, adapter_config(-1, lora_parameters(4, 10.0, 0.0, None),
                                                                  "builtin:tiny-random"))
            start = mx.load(str(Path(tmp) / "sft" / "adapters.safetensors"))
            blocks = sorted({int(k.split(".layers.")[1].split(".")[0]) for k in start})
            self.assertGreater(len(blocks), 1)
            data = stage_config(tmp, steps=2, save_every=1).model_dump()
            data["model"]["adapter"] = str(Path(tmp) / "sft")
            data["lora"]["train_layers"] = 1
            cfg = validate_config(data, stage.GRPOConfig, "test")
            with mock.patch.object(rl, "rollout", spread_rollout):
                stage.run(cfg)
            end = mx.load(str(Path(tmp) / "run" / "adapters" / "adapters.safetensors"))
            self.assertEqual(set(end), set(start))
            last = f".layers.{blocks[-1]}."
            for k in start:
                if last in k:
                    continue
                self.assertTrue(mx.array_equal(start[k], end[k]).item(), k)
            self.assertTrue(any(not mx.array_equal(start[k], end[k]).item() for k in start if last in k))
            policy = load_policy(cfg.model, cfg.lora, cfg.run.seed, start_adapter(cfg), PromptConfig(), "free", False)[0]
            trainable = {k for k, _ in tree_flatten(policy.trainable_parameters())}
            self.assertTrue(trainable and all(last in k for k in trainable))
            resumed = validate_config({**data, "run": {**data["run"], "steps": 3, "resume": str(Path(tmp) / "run")}},
                                      stage.GRPOConfig, "test")
            with mock.patch.object(rl, "rollout", spread_rollout):
                self.assertEqual(stage.run(resumed)["step"], 3)
            after = mx.load(str(Path(tmp) / "run" / "adapters" / "adapters.safetensors"))
            self.assertTrue(all(mx.array_equal(start[k], after[k]).item() for k in start if last not in k))
            self.assertTrue(any(not mx.array_equal(end[k], after[k]).item() for k in start if last in k))
            data["model"]["adapter"] = None
            with self.assertRaisesRegex(UserError, "lora.train_layers = 1 needs model.adapter"):
                validate_config(data, stage.GRPOConfig, "test")


if __name__ == "__main__":
    unittest.main()

"""Tests for `wordle-mlx sft` and `fuse` on the tiny random model: loss, resume, adapters, fuse check; the words
loss with the full loss added (decode, train_free), its record in the adapter, and grammar_loss, the old name."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from wordle_mlx.config import load_config, validate_config
from wordle_mlx.errors import UserError
from wordle_mlx.llm.model import lora
from wordle_mlx.llm.model.models import load_model, resolve_model
from wordle_mlx.llm.training import trainer
from wordle_mlx.llm.training.policy import trained_record
from wordle_mlx.llm.training.sft_data import read_sft_jsonl
from wordle_mlx.llm.training.sft_loss import loss_sum, make_batch
from wordle_mlx.storage.metrics import read_jsonl
from wordle_mlx.stages import data, fuse, sft

TINY = "builtin:tiny-random"


def sft_records(run_dir: Path, kind: str = "train") -> dict[int, dict]:
    return {r["step"]: r for _, r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == kind}


# the test's short names for the fields it varies
SHORT = {"data": "data.folder", "steps": "run.steps", "resume": "run.resume", "save_every": "run.save_every",
         "report_to": "run.report_to", "learning_rate": "optimizer.learning_rate",
         "start_adapter": "model.adapter"}


class SFTTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls.tmp.name)
        cfg = validate_config({"out": str(cls.root / "data"), "train_examples": 8, "valid_examples": 4,
                               "think_style": "brief", "progress": False,
                               "prompt": {"require_think": True, "style": "full", "guess_format": "word"}},
                              data.DataConfig, "test")
        data.run(cfg)
        cls.model, cls.tokenizer = load_model(TINY)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def config(self, name: str, **fields) -> sft.SFTConfig:
        """A tiny-model config; `fields` by the short names of SHORT (a dict for lora and validation)."""
        base = {"model": {"name": TINY}, "data": {"folder": str(self.root / "data"), "batch_size": 4,
                                                  "max_seq_length": 1024, "pad_to": 32},
                "run": {"logs_dir": str(self.root / "logs"), "name": name, "steps": 6, "save_every": 3,
                        "progress": False},
                "optimizer": {"learning_rate": 1e-2, "warmup_steps": 1}, "validation": {"every": 3, "batches": 0},
                "lora": {"rank": 4, "dropout": 0.1}}
        for key, value in fields.items():
            if key in ("lora", "validation"):
                base[key].update(value)
            elif key in SHORT:
                section, field = SHORT[key].split(".")
                base[section][field] = value
            else:
                base[key] = value
        return validate_config(base, sft.SFTConfig, "test")

    def test_selected_positions_loss_equals_full_logits_loss(self):
        records = read_sft_jsonl(self.root / "data" / "train.jsonl")[:3]
        batch = make_batch(sft.tokenize(records, self.tokenizer, Path("x")), pad_to=16)
        ours = loss_sum(self.model, batch.inputs, batch.positions, batch.targets, batch.weights)
        full = loss_sum(self.model, batch.inputs, batch.positions, batch.targets, batch.weights, full_logits=True)
        self.assertGreater(batch.tokens, 10)
        self.assertAlmostEqual(ours[0].item(), full[0].item(), delta=1e-4 * abs(full[0].item()))
        self.assertEqual(ours[1].item(), batch.tokens)

    def test_shared_prefix_batch_gives_the_same_loss_and_gradient(self):
        seqs = sft.tokenize(read_sft_jsonl(self.root / "data" / "train.jsonl")[:4], self.tokenizer, Path("x"))
        plain = make_batch(seqs, pad_to=16)
        shared = make_batch(seqs, pad_to=16, share_prefix=True)
        self.assertIsNone(plain.prefix)
        c = shared.prefix.shape[0]
        self.assertGreater(c, 5)                                     # <bos>, turn marker, the system prompt
        self.assertEqual(shared.prefix.tolist(), seqs[0][0][:c])
        self.assertTrue(all(t[:c] == seqs[0][0][:c] for t, _ in seqs))
        self.assertLessEqual(c, min(off for _, off in seqs) - 1)    # no target inside the prefix
        self.assertEqual(shared.targets.tolist(), plain.targets.tolist())
        grad = nn.value_and_grad(self.model, loss_sum)
        (s1, n1), g1 = grad(self.model, plain.inputs, plain.positions, plain.targets, plain.weights)
        (s2, n2), g2 = grad(self.model, shared.inputs, shared.positions, shared.targets, shared.weights, False,
                            shared.prefix)
        self.assertAlmostEqual(s2.item(), s1.item(), delta=1e-4 * abs(s1.item()))
        self.assertEqual(n1.item(), n2.item())
        for (k, a), (_, b) in zip(sorted(tree_flatten(g1)), sorted(tree_flatten(g2))):
            np.testing.assert_allclose(np.array(b), np.array(a), rtol=2e-3, atol=2e-5, err_msg=k)
        # the full-logits reference path puts the prefix back in front of every row
        full = loss_sum(self.model, shared.inputs, shared.positions, shared.targets, shared.weights, True, shared.prefix)
        self.assertAlmostEqual(full[0].item(), s1.item(), delta=1e-4 * abs(s1.item()))

    def test_matches_mlx_lm_default_loss_on_assistant_tokens(self):
        from mlx_lm.tuner.trainer import default_loss
        seqs = sft.tokenize(read_sft_jsonl(self.root / "data" / "train.jsonl")[:3], self.tokenizer, Path("x"))
        width = max(len(t) for t, _ in seqs) + 1
        arr = mx.array([[*t, *([0] * (width - len(t)))] for t, _ in seqs])
        # mlx-lm's mask is steps <= length, i.e. it also scores the pad after each sequence; length - 1 stops at the end
        theirs, _ = default_loss(self.model, arr, mx.array([[off, len(t) - 1] for t, off in seqs]))
        batch = make_batch(seqs)
        s, n = loss_sum(self.model, batch.inputs, batch.positions, batch.targets, batch.weights)
        self.assertAlmostEqual((s / n).item(), theirs.item(), delta=1e-5)

    def test_mask_covers_only_assistant_tokens(self):
        records = read_sft_jsonl(self.root / "data" / "train.jsonl")[:1]
        (tokens, offset), = sft.tokenize(records, self.tokenizer, Path("x"))
        batch = make_batch([(tokens, offset)], pad_to=8)
        target_text = self.tokenizer.decode(batch.targets[: batch.tokens].tolist())
        self.assertTrue(target_text.startswith("<think>"), target_text[:40])
        self.assertIn(records[0]["messages"][-1]["content"], target_text)
        self.assertEqual(batch.weights.sum().item(), len(tokens) - offset)

    def test_loss_falls_and_run_folder(self):
        cfg = self.config("memorise", steps=12, lora={"rank": 8, "dropout": 0.0}, max_tokens=8,
                          validation={"every": 3, "games": 2})
        result = sft.run(cfg)
        run_dir = Path(result["run"])
        losses = [r["loss"] for r in sft_records(run_dir).values()]
        self.assertLess(min(losses[-3:]), losses[0] - 1.0)   # nats; the tiny random model starts near log(384)
        valid = sft_records(run_dir, "valid")
        self.assertLess(valid[12]["val_loss"], valid[3]["val_loss"])
        kinds = [r["kind"] for _, r in read_jsonl(run_dir / "metrics.jsonl")]
        self.assertEqual(kinds[0], "run")
        self.assertIn("val_loss", valid[3])
        self.assertIn("win_rate", valid[12])
        for key in ("lr", "loss", "grad_norm", "tokens", "tokens_per_second", "peak_memory_gb"):
            self.assertIn(key, sft_records(run_dir)[1])
        self.assertTrue((run_dir / "config.json").is_file())
        self.assertEqual((run_dir / "checkpoints" / "latest").read_text().strip(), "step_000012")
        # the adapter records the prompts it was trained on, and eval/play use them unless told otherwise
        from wordle_mlx.llm.play.prompts import PromptConfig, adapter_prompt, choose_prompt
        trained = json.loads((self.root / "data" / "stats.json").read_text())["prompt"]
        self.assertEqual(adapter_prompt(run_dir / "adapters").model_dump(), trained)
        compact = PromptConfig(style="compact")
        self.assertEqual(choose_prompt(compact, True, run_dir / "adapters"), compact)
        self.assertEqual(choose_prompt(compact, False, run_dir / "adapters").model_dump(), trained)
        # and the decoding it was trained for: the full loss trains every reply token, the tags included
        acfg = json.loads((run_dir / "adapters" / "adapter_config.json").read_text())
        self.assertEqual((acfg["decode"], acfg["trained_free"]), ("free", True))
        self.assertEqual(choose_prompt(compact, False, None), compact)
        with self.assertRaisesRegex(UserError, "already exists"):
            sft.run(cfg)
        # mlx-lm itself loads the adapter folder, and it changes the model's output
        import mlx_lm
        base_dir = str(resolve_model(TINY))
        adapted, tok = mlx_lm.load(base_dir, adapter_path=str(run_dir / "adapters"))
        base, _ = mlx_lm.load(base_dir)
        inputs = mx.array([fuse.check_batch(tok)])
        self.assertGreater(mx.abs(adapted(inputs) - base(inputs)).max().item(), 1e-3)
        self.fuse_checks(run_dir / "adapters")

    def fuse_checks(self, adapters: Path):
        out = self.root / "fused"
        cfg = fuse.FuseConfig(model=TINY, adapter=str(adapters), out=str(out))
        result = fuse.run(cfg)
        self.assertLessEqual(result["max_abs_logit_diff"], result["tolerance"])
        import mlx_lm
        fused, tok = mlx_lm.load(str(out))
        self.assertIsNotNone(tok.chat_template)
        self.assertFalse(any("lora" in k for k, _ in tree_flatten(fused.parameters())))
        with self.assertRaisesRegex(UserError, "already exists"):
            fuse.run(cfg)
        # a corrupted fuse (one fused weight perturbed) is detected and leaves nothing behind
        real = fuse.fuse_lora_layers

        def corrupt(model, *args):
            n = real(model, *args)
            layer = model.layers[0].self_attn.q_proj
            layer.weight = layer.weight + 0.5
            return n

        bad_out = self.root / "fused_bad"
        with mock.patch.object(fuse, "fuse_lora_layers", corrupt):
            with self.assertRaisesRegex(UserError, "fuse check failed"):
                fuse.run(fuse.FuseConfig(model=TINY, adapter=str(adapters), out=str(bad_out)))
        self.assertFalse(bad_out.exists())
        self.assertEqual([p.name for p in self.root.iterdir() if "fused_bad" in p.name], [])

    def test_resume_matches_uninterrupted_run(self):
        full = sft.run(self.config("full"))
        interrupted = self.config("cut", save_every=0)
        real_gradient, calls = trainer.accumulate_gradients, []

        def ctrl_c_in_step_5(*args):
            calls.append(1)
            if len(calls) == 5:
                raise KeyboardInterrupt          # a second Ctrl-C: the unfinished step is dropped
            return real_gradient(*args)

        with mock.patch.object(trainer, "accumulate_gradients", ctrl_c_in_step_5):
            result = sft.run(interrupted)
        self.assertEqual((result["step"], result["stopped"], result["signal"]), (4, "interrupted", "SIGINT"))
        cut_dir = self.root / "logs" / "cut"
        self.assertEqual(lora.latest_checkpoint(cut_dir / "checkpoints").name, "step_000004")
        resumed_cfg = load_config(cut_dir / "config.json", sft.SFTConfig)
        sft.run(resumed_cfg.model_copy(update={"run": resumed_cfg.run.model_copy(update={"resume": str(cut_dir)})}))
        a, b = sft_records(Path(full["run"])), sft_records(cut_dir)
        for step in (4, 5, 6):
            self.assertAlmostEqual(a[step]["loss"], b[step]["loss"], delta=1e-6)   # float32 sums of a few nats
            self.assertAlmostEqual(a[step]["grad_norm"], b[step]["grad_norm"], delta=1e-5)
        wa = mx.load(str(Path(full["run"]) / "adapters" / "adapters.safetensors"))
        wb = mx.load(str(cut_dir / "adapters" / "adapters.safetensors"))
        self.assertEqual(set(wa), set(wb))
        for k in wa:
            self.assertLess(mx.abs(wa[k] - wb[k]).max().item(), 1e-6)
        runs = [r for _, r in read_jsonl(cut_dir / "metrics.jsonl") if r["kind"] == "run"]
        self.assertEqual([r["resumed_from_step"] for r in runs], [None, 4])

    def test_start_adapter_starts_from_its_weights(self):
        first = sft.run(self.config("init_src", steps=3, lora={"rank": 4, "dropout": 0.0}))
        src = mx.load(str(Path(first["adapters"]) / "adapters.safetensors"))
        # a learning rate of ~0 keeps the weights where the init adapter put them
        second = sft.run(self.config("init_dst", steps=1, learning_rate=1e-12, lora={"rank": 4, "dropout": 0.0},
                                     start_adapter=first["adapters"]))
        dst = mx.load(str(Path(second["adapters"]) / "adapters.safetensors"))
        self.assertEqual(set(src), set(dst))
        self.assertTrue(any(mx.abs(v).max().item() > 1e-3 for k, v in src.items() if "lora_b" in k))
        for k in src:
            self.assertLess(mx.abs(src[k] - dst[k]).max().item(), 1e-6, k)
        saved = json.loads((Path(second["run"]) / "config.json").read_text())
        self.assertEqual(saved["model"]["adapter"], str(Path(first["adapters"]).resolve()))
        # the adapter's own layout applies (as mlx-lm loads it), whatever the lora section says
        third = sft.run(self.config("init_layout", steps=1, learning_rate=1e-12, lora={"rank": 8, "scale": 10.0},
                                    start_adapter=first["adapters"]))
        acfg = json.loads((Path(third["adapters"]) / "adapter_config.json").read_text())
        self.assertEqual((acfg["lora_parameters"]["rank"], acfg["lora_parameters"]["scale"]), (4, 20.0))
        with self.assertRaisesRegex(UserError, "model.adapter .*nowhere: no such adapter folder"):
            sft.run(self.config("init_none", steps=1, start_adapter=str(self.root / "nowhere")))
        empty = self.root / "empty_adapter"
        empty.mkdir()
        with self.assertRaisesRegex(UserError, "adapter .*empty_adapter.*: missing adapter_config.json"):
            sft.run(self.config("init_empty", steps=1, start_adapter=str(empty)))
        self.assertFalse((self.root / "logs" / "init_empty").exists())   # a failed start leaves no run folder

    def test_train_layers_trains_only_the_last_blocks(self):
        first = sft.run(self.config("layers_src", steps=3, lora={"rank": 4, "dropout": 0.0}))
        src = mx.load(str(Path(first["adapters"]) / "adapters.safetensors"))
        last = max(int(k.split(".layers.")[1].split(".")[0]) for k in src)
        second = sft.run(self.config("layers_dst", steps=2, lora={"rank": 4, "dropout": 0.0, "train_layers": 1},
                                     start_adapter=first["adapters"]))
        out = mx.load(str(Path(second["adapters"]) / "adapters.safetensors"))
        self.assertEqual(set(out), set(src))
        mark = f".layers.{last}."
        self.assertTrue(all(mx.array_equal(src[k], out[k]).item() for k in src if mark not in k))
        self.assertTrue(any(not mx.array_equal(src[k], out[k]).item() for k in src if mark in k))
        run = next(r for _, r in read_jsonl(Path(second["run"]) / "metrics.jsonl") if r["kind"] == "run")
        self.assertEqual(run["trainable_parameters"], sum(v.size for k, v in src.items() if mark in k))
        with self.assertRaisesRegex(UserError, "lora.train_layers = 2 needs model.adapter"):
            validate_config({"lora": {"train_layers": 2}}, sft.SFTConfig, "x.json")
        with self.assertRaisesRegex(UserError, r"lora.train_layers = 99 is more than the \d+ blocks"):
            sft.run(self.config("layers_many", steps=1, lora={"rank": 4, "dropout": 0.0, "train_layers": 99},
                                start_adapter=first["adapters"]))

    def test_report_to_tensorboard_writes_the_steps_into_the_run_folder(self):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        result = sft.run(self.config("tb", steps=2, report_to="tensorboard", validation={"every": 2}))
        events = EventAccumulator(str(Path(result["run"]) / "tensorboard"))
        events.Reload()
        logged = sft_records(Path(result["run"]))
        self.assertEqual([e.step for e in events.Scalars("train/loss")], [1, 2])
        for event in events.Scalars("train/loss"):       # stored as float32
            self.assertAlmostEqual(event.value, logged[event.step]["loss"], delta=1e-6 * abs(event.value))
        self.assertEqual([e.step for e in events.Scalars("valid/val_loss")], [2])
        self.assertIn("run/config", events.Tags()["tensors"])

    def test_bad_inputs(self):
        with self.assertRaisesRegex(UserError, "train.jsonl: file not found"):
            sft.run(self.config("nodata", data=str(self.root / "nowhere")))
        with self.assertRaisesRegex(UserError, "lora.rank"):
            validate_config({"lora": {"rank": 0}}, sft.SFTConfig, "x.json")
        with self.assertRaisesRegex(UserError, "optimizer.learning_rat: unknown field"):
            validate_config({"optimizer": {"learning_rat": 1}}, sft.SFTConfig, "x.json")
        with self.assertRaisesRegex(UserError, "^x.json: learning_rate: unknown field \\(got 1\\)$"):
            validate_config({"learning_rate": 1}, sft.SFTConfig, "x.json")
        with self.assertRaisesRegex(UserError, "no config.json"):
            sft.run(self.config("r", resume=str(self.root / "nothing")))

    def test_decode_words_with_train_free_trains_and_records_it(self):
        """decode words with train_free on letters-format data: the run trains (the targets are each reply's 5 letters
        among the letters, and every reply token over the vocabulary), and the adapter records words decoding with
        its whole reply trained; the old name train_tags is a one-line error; a label already on
        its board is a one-line error naming the record."""
        folder = self.root / "letters"
        data.run(validate_config({"out": str(folder), "train_examples": 8, "valid_examples": 4, "progress": False},
                                 data.DataConfig, "test"))
        result = sft.run(self.config("words", data=str(folder), steps=2, decode="words", train_free=True,
                                     validation={"every": 2}))
        self.assertTrue(np.isfinite(result["final_loss"]))
        first = sft_records(Path(result["run"]))[1]
        self.assertGreater(first["target_tokens"], 2 * 5 * 4)       # letters twice, and the tags, of 4 replies
        acfg = json.loads((Path(result["run"]) / "adapters" / "adapter_config.json").read_text())
        self.assertEqual((acfg["decode"], acfg["trained_free"]), ("words", True))
        # a start adapter with the old record (the tags alone, words decoding): not trained for free, and the old
        # key does not carry over
        start = Path(result["run"]) / "adapters"
        old = {k: v for k, v in acfg.items() if k != "trained_free"}
        (start / "adapter_config.json").write_text(json.dumps({**old, "trained_tags": True}))
        again = sft.run(self.config("words-again", data=str(folder), steps=1, decode="words", start_adapter=str(start)))
        acfg = json.loads((Path(again["run"]) / "adapters" / "adapter_config.json").read_text())
        self.assertEqual((acfg["decode"], acfg["trained_free"], "trained_tags" in acfg), ("words", False, False))
        records = read_sft_jsonl(folder / "train.jsonl")
        seeded = next(i for i, r in enumerate(records) if r["meta"]["history"])
        records[seeded]["meta"]["history"].append(records[seeded]["meta"]["target"])
        (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        with self.assertRaisesRegex(UserError, rf"record {seeded + 1}: decode 'words': the reply '\w+' is already on"):
            sft.run(self.config("words2", data=str(folder), steps=1, decode="words"))
        with self.assertRaisesRegex(UserError, "^x.json: train_tags: unknown field \\(got true\\)$"):
            validate_config({"decode": "words", "train_tags": True}, sft.SFTConfig, "x.json")

    def test_the_record_keeps_free_training_from_the_start_adapter(self):
        self.assertEqual(trained_record("words", False, None), {"decode": "words", "trained_free": False})
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "adapter_config.json").write_text(json.dumps({"decode": "free", "trained_free": True}))
            self.assertEqual(trained_record("words", False, Path(tmp)), {"decode": "words", "trained_free": True})
        self.assertEqual(trained_record("grammar", True, None), {"decode": "grammar", "trained_free": True})
        self.assertEqual(trained_record("free", False, None), {"decode": "free", "trained_free": True})

    def test_grammar_loss_is_an_unknown_field(self):
        with self.assertRaisesRegex(UserError, "^x.json: grammar_loss: unknown field \\(got true\\)$"):
            validate_config({"grammar_loss": True}, sft.SFTConfig, "x.json")
        self.assertEqual(validate_config({"decode": "words"}, sft.SFTConfig, "x.json").decode, "words")

    def test_data_without_stats_json_must_use_the_default_prompt(self):
        from wordle_mlx.llm.play.prompts import PromptConfig, system_prompt
        records = read_sft_jsonl(self.root / "data" / "train.jsonl")
        full = system_prompt(PromptConfig(style="full", require_think=True, guess_format="word"))
        for name, system in (("nostats_default", system_prompt(PromptConfig())), ("nostats_full", full)):
            folder = self.root / name
            folder.mkdir()
            rows = [{**r, "messages": [{"role": "system", "content": system}] +
                     [m for m in r["messages"] if m["role"] != "system"]} for r in records]
            (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (folder / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
        self.assertEqual(sft.load_data(self.root / "nostats_default", True)[2], PromptConfig())
        with self.assertRaisesRegex(UserError, r"nostats_full/stats\.json: missing, and .*train\.jsonl record 1 "
                                    r"has the system prompt 'You are playing Wordle"):
            sft.load_data(self.root / "nostats_full", True)

    def test_broken_adapter_prompt_is_a_one_line_error(self):
        from wordle_mlx.llm.play.prompts import ADAPTER_PROMPT_KEY, adapter_prompt
        folder = self.root / "bad_prompt"
        folder.mkdir()
        params = lora.lora_parameters(4, 20.0, 0.0, None)
        (folder / "adapter_config.json").write_text(json.dumps(
            {**lora.adapter_config(-1, params, TINY), ADAPTER_PROMPT_KEY: {"style": "tiny"}}))
        with self.assertRaisesRegex(UserError, r"adapter_config\.json: wordle_prompt: .*style"):
            adapter_prompt(folder)
        self.assertIsNone(adapter_prompt(self.root / "no_such_adapter"))

    def test_adapter_for_another_model_is_rejected(self):
        folder = self.root / "alien_adapter"
        folder.mkdir()
        params = lora.lora_parameters(4, 20.0, 0.0, None)
        (folder / "adapter_config.json").write_text(json.dumps(lora.adapter_config(-1, params, "other")))
        mx.save_safetensors(str(folder / "adapters.safetensors"),
                            {"model.layers.0.self_attn.q_proj.lora_a": mx.zeros((128, 4)),
                             "model.layers.0.self_attn.q_proj.lora_b": mx.zeros((4, 64))})
        with self.assertRaisesRegex(UserError, "does not fit model"):
            fuse.run(fuse.FuseConfig(model=TINY, adapter=str(folder), out=str(self.root / "alien_out")))
        self.assertFalse((self.root / "alien_out").exists())


if __name__ == "__main__":
    unittest.main()

"""The memory planner: exact arithmetic on small dimensions (`planning/memory.py`), config reading and errors
(`planning/stage_plan.py`, `stages/plan.py`), and the `wordle-mlx plan` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from wordle_mlx.errors import UserError
from wordle_mlx.planning import memory as mp, stage_plan
from wordle_mlx.stages import plan

ROOT = Path(__file__).resolve().parent.parent
SMALL = mp.ModelDims(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32,
                     sliding_window=4, sliding_window_pattern=2, value_bytes=2)


class ArithmeticTest(unittest.TestCase):
    def test_parameters_and_weights(self):
        # embedding 32 x 8 = 256; per block q 64 + k 32 + v 32 + o 64 + gate 128 + up 128 + down 128 = 576
        self.assertEqual(mp.text_parameters(SMALL), (256 + 2 * 576, 2 * (4 * 8 + 2 * 4) + 8))
        self.assertEqual(mp.weight_bytes(SMALL), (1408 + 88) * 2)
        q4 = mp.ModelDims(**{**SMALL.__dict__, "bits": 4, "group_size": 8})
        # 1408 values at 4 bits + 176 groups x (scale + bias) x 2 B + 88 norm values x 2 B
        self.assertEqual(mp.weight_bytes(q4), 704 + 176 * 2 * 2 + 88 * 2)

    def test_lora(self):
        # rank 2 x (in + out) over q 16, k 12, v 12, o 16, gate 24, up 24, down 24, in the last block only
        self.assertEqual(mp.lora_parameters(SMALL, rank=2, num_layers=1), 2 * 128)
        self.assertEqual(mp.lora_parameters(SMALL, rank=2, num_layers=-1, keys=("self_attn.q_proj",)), 2 * 2 * 16)
        self.assertEqual(mp.lora_bytes(256, optimizer_states=2), 256 * 4 * 4)
        self.assertEqual(mp.lora_bytes(256, optimizer_states=0), 256 * 4 * 2)
        # only the trained ones (lora.train_layers) have gradients and optimizer states
        self.assertEqual(mp.lora_bytes(256, optimizer_states=2, trained=64), 256 * 4 + 64 * 4 * 3)
        self.assertEqual(mp.trained_blocks(SMALL, num_layers=-1, train_layers=None), 2)
        self.assertEqual(mp.trained_blocks(SMALL, num_layers=-1, train_layers=1), 1)
        self.assertEqual(mp.trained_blocks(SMALL, num_layers=1, train_layers=None), 1)

    def test_kv_cache_minds_sliding_layers(self):
        # layer 0 slides (window 4), layer 1 is global: 256 allocated tokens (one step of mlx-lm's cache)
        self.assertEqual(SMALL.sliding_layers(), 1)
        self.assertEqual(mp.kv_cache_bytes(SMALL, rows=3, tokens=10), 3 * (4 + 256) * 1 * 4 * 2 * 2)
        self.assertEqual(mp.kv_cache_bytes(SMALL, rows=1, tokens=257), (4 + 512) * 1 * 4 * 2 * 2)
        self.assertEqual(mp.kv_cache_bytes(SMALL, rows=2, tokens=10, allocated=263), 2 * (4 + 263) * 1 * 4 * 2 * 2)

    def test_batch_cache_width_grows_by_steps_with_the_reply(self):
        # the prompt's positions, plus 256 at the first decoded token and 256 more after every 256 tokens
        self.assertEqual(mp.batch_cache_width(7, 3), 7 + 256)
        self.assertEqual(mp.batch_cache_width(7, 256), 7 + 256)
        self.assertEqual(mp.batch_cache_width(7, 257), 7 + 512)

    def test_activations_and_logits(self):
        # 8 x 8 hidden + 2 x (2 + 2) x 4 qkv + 2 x 4 attention out + 4 x 16 MLP + 2 x 2 heads x 10 scores
        self.assertEqual(mp.activation_values_per_token(SMALL, 10), 64 + 32 + 8 + 64 + 40)
        self.assertEqual(mp.activation_bytes(SMALL, 30, 10, grad_checkpoint=False), 2 * 30 * 208 * 2)
        self.assertEqual(mp.activation_bytes(SMALL, 30, 10, grad_checkpoint=True), 2 * 30 * 8 * 2 + 30 * 208 * 2)
        self.assertEqual(mp.logit_bytes(SMALL, 5), 5 * 32 * (2 + 4 * 3))
        self.assertEqual(mp.logit_bytes(SMALL, 5, letters_only=True), 5 * 26 * (2 + 4 * 3))
        # on the CPU the vocabulary-wide softmax is numpy's: MLX holds the logits and their gradient only
        self.assertEqual(mp.logit_bytes(SMALL, 5, numpy_loss=True), 5 * 32 * (2 + 4 * 1))
        self.assertEqual(mp.logit_bytes(SMALL, 5, letters_only=True, numpy_loss=True), 5 * 26 * (2 + 4 * 3))
        # the blocks below the trained ones keep nothing for the backward pass
        self.assertEqual(mp.activation_bytes(SMALL, 30, 10, grad_checkpoint=False, layers=1), 30 * 208 * 2)
        self.assertEqual(mp.decode_logit_bytes(SMALL, 5), 5 * 32 * (3 * 2 + 4))

    def test_sft_plan_sums_its_parts(self):
        n = mp.SFTNumbers(batch_size=3, row_length=10, reply_tokens=3, pad_to=8, rank=2, num_layers=1, keys=None,
                          grad_checkpoint=False)
        p = mp.sft_plan(SMALL, n)
        # 3 rows padded to 16 tokens through the one LoRA block, 9 target positions padded to 16
        self.assertEqual(p.items, {"weights": 2992, "lora": 4096,
                                   "activations": 3 * 16 * 208 * 2,
                                   "logits": mp.logit_bytes(SMALL, 16)})
        self.assertEqual(p.peak, sum(p.items.values()))
        # a shared 4-token start runs once: each row keeps 6 tokens of its own, padded to 8
        shared = mp.sft_plan(SMALL, mp.SFTNumbers(**{**n.__dict__, "shared_prefix": 4}))
        self.assertEqual(shared.items["activations"], mp.activation_bytes(SMALL, 3 * 8 + 4, 10, False, 1))
        # the grammar loss: 5 letters a row over 26 letter rows
        letters = mp.sft_plan(SMALL, mp.SFTNumbers(**{**n.__dict__, "grammar_loss": True}))
        self.assertEqual(letters.items["logits"], mp.logit_bytes(SMALL, 3 * 5, letters_only=True))
        # train_free: every reply token (13 a row here) over the vocabulary too
        tags = mp.sft_plan(SMALL, mp.SFTNumbers(**{**n.__dict__, "grammar_loss": True, "train_free": True,
                                                   "reply_tokens": 13}))
        self.assertEqual(tags.items["logits"], mp.logit_bytes(SMALL, 3 * 5, letters_only=True)
                         + mp.logit_bytes(SMALL, 40))       # 3 x 13 reply tokens, padded to 8

    def test_grpo_plan_takes_the_larger_phase(self):
        n = mp.GRPONumbers(batch_prompts=2, generations=3, prompt_tokens=7, reply_tokens=3, completion_batch_size=4,
                           max_tokens_per_microbatch=40, max_loss_tokens_per_microbatch=4, rank=2, num_layers=1,
                           keys=None, optimizer_states=0)
        # 40 // 10 = 4 rows of 10 tokens in a micro-batch through the one LoRA block, 4 loss positions
        update = mp.activation_bytes(SMALL, 4 * 10, 10, False, 1) + mp.logit_bytes(SMALL, 4)
        self.assertEqual(update, 40 * 208 * 2 + 4 * 32 * 14)
        for rows, phase in ((1, "update"), (6, "rollout")):
            with self.subTest(rows=rows):
                p = mp.grpo_plan(SMALL, mp.GRPONumbers(**{**n.__dict__, "completion_batch_size": rows}))
                # 16 B of keys and values per token and layer: the 2 prompts' caches and their shared prefix's,
                # one 256-token step each (the sliding layer keeps its window of 4); the decoding batch's cache,
                # rows x (7 + 256) positions; per row 32 x (3 x 2 + 4) B of sampling logits
                rollout = 3 * (4 + 256) * 16 + rows * (4 + 263) * 16 + rows * 32 * (3 * 2 + 4)
                self.assertEqual(p.peak, 2992 + 256 * 4 * 2 + max(rollout, update))
                self.assertIn(f"{phase} phase", p.notes["phase"])

    def test_grpo_rollout_grows_with_boards_generations_and_lengths(self):
        n = mp.GRPONumbers(batch_prompts=2, generations=5, prompt_tokens=90, reply_tokens=16, completion_batch_size=64,
                           max_tokens_per_microbatch=2048, max_loss_tokens_per_microbatch=256, rank=16,
                           num_layers=-1, keys=None, optimizer_states=0, share_prompts=True)

        def rollout(**changes) -> int:
            return sum(mp.grpo_rollout_bytes(SMALL, mp.GRPONumbers(**{**n.__dict__, **changes})).values())

        for changes in ({"batch_prompts": 8}, {"generations": 9}, {"reply_tokens": 300}, {"prompt_tokens": 200}):
            with self.subTest(**changes):
                self.assertGreater(rollout(**changes), rollout())
        # rows beyond completion_batch_size wait their turn: 4 x 5 boards' rows decode 10 at a time, and only the
        # prompt caches (4 prompts + the shared prefix, 16 B per token and layer) grow with the boards
        capped = mp.grpo_rollout_bytes(SMALL, mp.GRPONumbers(**{**n.__dict__, "completion_batch_size": 10,
                                                                "batch_prompts": 4}))
        self.assertEqual(capped, {"kv_cache": 5 * (4 + 256) * 16 + 10 * (4 + 90 + 256) * 16,
                                  "logits": mp.decode_logit_bytes(SMALL, 10)})

    def test_grpo_shared_prompts_pass_one_group(self):
        n = mp.GRPONumbers(batch_prompts=2, generations=3, prompt_tokens=300, reply_tokens=3, completion_batch_size=1,
                           max_tokens_per_microbatch=25, max_loss_tokens_per_microbatch=100, rank=2, num_layers=1,
                           keys=None, optimizer_states=0, share_prompts=True)
        p = mp.grpo_plan(SMALL, n)      # one prompt of 300 tokens and its 3 replies of 3: 309 tokens, 9 positions
        self.assertIn("update phase", p.notes["phase"])
        self.assertEqual(p.items["activations"], mp.activation_bytes(SMALL, 300 + 9, 303, False, 1))
        self.assertEqual(p.items["logits"], mp.logit_bytes(SMALL, 9))
        # groups are merged into one pass while their loss tokens and padded tokens fit: 3 of 4 boards here
        merged = mp.grpo_plan(SMALL, mp.GRPONumbers(**{**n.__dict__, "batch_prompts": 4, "prompt_tokens": 10,
                                                       "max_tokens_per_microbatch": 60, "max_loss_tokens_per_microbatch": 27}))
        self.assertEqual(merged.items["activations"], mp.activation_bytes(SMALL, 3 * 10 + 27, 13, False, 1))
        self.assertEqual(merged.items["logits"], mp.logit_bytes(SMALL, 27))
        self.assertIn("3 prompts of 10 + 27 reply", merged.notes["activations"])

    def test_letter_decoding_keeps_no_vocabulary_rows(self):
        n = mp.GRPONumbers(batch_prompts=2, generations=3, prompt_tokens=7, reply_tokens=16, completion_batch_size=4,
                           max_tokens_per_microbatch=40, max_loss_tokens_per_microbatch=40, rank=2, num_layers=-1,
                           keys=None, optimizer_states=1, share_prompts=True, decode="grammar")
        # 16 B of keys and values per token and layer x 2 layers: the shared start and the chunk's 2 prompts, 7
        # tokens each, then each of the chunk's 4 rows' own copy of its prompt and its 5 letters; the prefill
        # transient (2 prompts x 7 tokens x (3 x 16 x 2 B MLP + 2 heads x 7 x 4 B scores)); 26 logits a row
        rollout = mp.grpo_rollout_bytes(SMALL, n)
        self.assertEqual(rollout, {"kv_cache": (3 * 7 + 4 * 12) * 2 * 16,
                                   "logits": 2 * 7 * (3 * 16 * 2 + 2 * 7 * 4) + 4 * 26 * 4})
        p = mp.grpo_plan(SMALL, n)
        self.assertEqual(p.items["logits"], mp.logit_bytes(SMALL, 3 * 5, letters_only=True))   # 5 letters a reply
        self.assertEqual(p.items["lora"], mp.lora_bytes(2 * 2 * 128, 1))

    def test_fitting_sizes_and_largest_batch(self):
        # Metal's recommended working set: two thirds of memory up to 32 GB (10.67 of 16), three quarters above
        self.assertEqual(mp.working_set(16), 16 * mp.GB * 2 / 3)
        self.assertEqual((mp.working_set(32), mp.working_set(36)), (32 * mp.GB * 2 / 3, 27 * mp.GB))
        self.assertEqual(mp.fitting_sizes(int(16 * mp.GB * 2 / 3)), [16, 24, 32, 36, 48, 64, 96, 128])
        self.assertEqual(mp.fitting_sizes(int(16 * mp.GB * 2 / 3) + 1), [24, 32, 36, 48, 64, 96, 128])
        self.assertEqual(mp.fitting_sizes(int(24 * mp.GB)), [36, 48, 64, 96, 128])    # not 32 GB's 21.3
        self.assertEqual(mp.largest_fitting(lambda n: mp.MemoryPlan({"x": 100 * n}), 1050), 10)
        self.assertEqual(mp.largest_fitting(lambda n: mp.MemoryPlan({"x": 100 * n}), 99), 0)


def write_json(folder: Path, name: str, data) -> Path:
    path = folder / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


class PlanStageTest(unittest.TestCase):
    CONFIG = {"model_type": "gemma3", "vocab_size": 64, "torch_dtype": "bfloat16",
              "quantization": {"group_size": 8, "bits": 4},
              "text_config": {"hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 16, "head_dim": 4,
                              "num_attention_heads": 2, "num_key_value_heads": 1, "sliding_window": 4,
                              "sliding_window_pattern": 2}}

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.model_json = write_json(self.tmp, "config.json", self.CONFIG)

    def tearDown(self):
        import shutil
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_dims_read_as_mlx_lm_reads_them(self):
        dims = stage_plan.model_dims(self.CONFIG, "bfloat16", "config.json", keeps_stored=False)
        self.assertEqual(dims, mp.ModelDims(8, 2, 2, 1, 4, 16, 64, 4, 2, 2, bits=4, group_size=8))
        # the 4B's config leaves heads out: mlx-lm's gemma3 wrapper fills 8 and 4
        bare = {"model_type": "gemma3", "text_config": {"hidden_size": 2560, "num_hidden_layers": 34}}
        dims = stage_plan.model_dims(bare, None, "config.json", keeps_stored=True)
        self.assertEqual((dims.heads, dims.kv_heads, dims.head_dim, dims.vocab, dims.value_bytes),
                         (8, 4, 256, 262_208, 4))

    def test_sft_and_grpo_configs_are_told_apart(self):
        sft = write_json(self.tmp, "sft.json", {"model": {"name": str(self.tmp), "grad_checkpoint": True},
                                                "run": {"steps": 1}, "data": {"batch_size": 3, "folder": "nowhere"}})
        grpo = write_json(self.tmp, "grpo.json", {"model": {"name": str(self.tmp)}, "rl": {"batch_prompts": 2}})
        for path, kind, field in ((sft, "sft", "data.batch_size"), (grpo, "grpo", "rl.batch_prompts")):
            with self.subTest(kind=kind):
                r = plan.run(plan.PlanConfig(config=str(path), memory_gb=8, json_output=True))
                self.assertEqual((r["stage"], r["batch_field"], r["bits"]), (kind, field, 4))
                self.assertAlmostEqual(r["peak_gb"], sum(r["items_gb"].values()), delta=0.003)
                self.assertEqual(r["fits_mac_gb"], list(mp.MAC_SIZES_GB))
        r = plan.run(plan.PlanConfig(config=str(sft), json_output=True))
        self.assertIn("checkpointed", r["notes"]["activations"])

    def test_bad_inputs_are_one_line_errors(self):
        bad = write_json(self.tmp, "bad.json", {"model": {"name": "x"}, "run": {"steps": 0}})
        with self.assertRaises(UserError) as e:
            plan.stage_config(str(bad))
        self.assertIn(str(bad), str(e.exception))
        self.assertIn("not an SFT, GRPO, self-play, eval, fuse or export config", str(e.exception))
        hub = write_json(self.tmp, "hub.json", {"model": {"name": "someone/not-cached-model-xyz"}})
        with self.assertRaises(UserError) as e:
            plan.run(plan.PlanConfig(config=str(hub)))
        self.assertIn("someone/not-cached-model-xyz", str(e.exception))
        llama = write_json(self.tmp, "llama.json", {"model_type": "llama"})
        with self.assertRaises(UserError) as e:
            plan.run(plan.PlanConfig(config=str(hub), model_json=str(llama)))
        self.assertIn("model_type 'llama'", str(e.exception))

    def test_plans_before_the_download_for_every_4b_config(self):
        """No model on disk, no --model-config: the 4B recipe's stage configs (as `wordle-mlx recipe --model
        mlx-community/gemma-3-4b-it-VARIANT` writes them) plan from the known dimensions, which are the ones of the
        Mac-layout rehearsal checkpoint."""
        from wordle_mlx.planning.gemma3_sizes import known_config
        from tests.rehearsal.mac_layouts import TEXT_CONFIG_4B

        known = known_config("mlx-community/gemma-3-4b-it-bf16")["text_config"]
        self.assertEqual({k: v for k, v in TEXT_CONFIG_4B.items() if k in known}, known)
        self.assertEqual(known_config("mlx-community/gemma-3-4b-it-4bit")["quantization"]["bits"], 4)
        self.assertIsNone(known_config("someone/llama-7b"))
        from tests.rehearsal.recipe import chain_4b
        from wordle_mlx.stages.recipe_build import write_snapshot

        kinds = set()
        before = os.getcwd()
        os.chdir(self.tmp)                     # the snapshots' paths, relative to their folder, stay inside it
        try:
            for variant in ("bf16", "4bit"):
                for name, stage in chain_4b(variant).items():     # the recipe's stages for the 4B model
                    if stage.kind not in ("sft", "grpo", "eval", "self-play") or name == "eval-fused-greedy":
                        continue
                    with self.subTest(config=f"{name}-{variant}"):
                        path = write_snapshot(stage, Path(variant))
                        r = plan.run(plan.PlanConfig(config=str(path), json_output=True))
                        self.assertEqual(r["stage"], stage.kind)
                        kinds.add(r["stage"])
                        self.assertGreater(r["peak_gb"], 2.0 if variant == "4bit" else 7.0)   # the weights alone
        finally:
            os.chdir(before)
        self.assertEqual(kinds, {"sft", "grpo", "eval", "self-play"})

    def test_measure_runs_two_steps_and_projects_the_stage(self):
        import contextlib
        import io

        from wordle_mlx.stages import data, plan_measure

        data.run(data.DataConfig(out=str(self.tmp / "data"), train_examples=8, valid_examples=2, think_style="none",
                                 progress=False))
        path = write_json(self.tmp, "sft.json", {"model": {"name": "builtin:tiny-random"},
                                                 "data": {"folder": "data", "batch_size": 2},
                                                 "run": {"steps": 40, "progress": False}, "validation": {"every": 10}})
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            r = plan_measure.run(plan.PlanConfig(config=str(path), measure=True))
        m = r["measured"]
        self.assertEqual((m["unit"], m["units"]), ("step", 40))
        self.assertGreater(m["peak_gb"], 0.0)
        self.assertAlmostEqual(m["projected_seconds"], 40 * m["seconds_per_unit"], delta=1e-9 * 40)
        self.assertIn("measured on this machine", out.getvalue())
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir()), ["config.json", "data", "sft.json"])

    def test_sgd_state_is_what_mlx_allocates(self):
        import mlx.core as mx
        from mlx.utils import tree_flatten

        from wordle_mlx.config import load_config
        from wordle_mlx.llm.model import lora
        from wordle_mlx.llm.model.models import load_model
        from wordle_mlx.llm.training.trainer import make_optimizer
        from wordle_mlx.stages import grpo

        path = write_json(self.tmp, "grpo.json", {"model": {"name": "builtin:tiny-random", "adapter": None},
                                                  "optimizer": {"name": "sgd"}})
        cfg = load_config(path, grpo.GRPOConfig)
        model, _ = load_model("builtin:tiny-random")
        lora.apply_lora(model, cfg.lora.num_layers, lora.lora_parameters(cfg.lora.rank, cfg.lora.scale, 0.0, None))
        optimizer, _ = make_optimizer(cfg.optimizer, cfg.run.steps)
        optimizer.init(model.trainable_parameters())
        state = sum(v.nbytes for k, v in tree_flatten(optimizer.state) if k not in ("step", "learning_rate"))
        numbers, _ = stage_plan.grpo_numbers(cfg, None)
        dims = stage_plan.model_dims(stage_plan.model_config_dict("builtin:tiny-random", None), "float32", "tiny",
                                     keeps_stored=False)
        params = mp.lora_parameters(dims, numbers.rank, numbers.num_layers, numbers.keys)
        self.assertEqual(params, sum(v.size for _, v in tree_flatten(model.trainable_parameters())))
        self.assertEqual(mp.lora_bytes(params, numbers.optimizer_states) - mp.lora_bytes(params, 0), state)
        self.assertGreater(state, 0)
        self.assertEqual(mx.float32, tree_flatten(optimizer.state)[-1][1].dtype)

    def test_warning_before_a_run_that_cannot_fit(self):
        import contextlib
        import io

        from wordle_mlx.config import load_config
        from wordle_mlx.stages.sft import SFTConfig

        for batch, warned in ((2, False), (10 ** 9, True)):
            with self.subTest(batch=batch):
                path = write_json(self.tmp, "sft.json", {"model": {"name": str(self.tmp)}, "data": {"batch_size": batch}})
                err = io.StringIO()
                with contextlib.redirect_stderr(err):
                    stage_plan.warn_if_over_working_set("sft", load_config(path, SFTConfig))
                self.assertEqual(err.getvalue().startswith("warning: the memory plan of this sft step is"), warned)
                self.assertLessEqual(len(err.getvalue().splitlines()), 1)

    def test_command_line(self):
        sft = write_json(self.tmp, "sft.json", {"model": {"name": str(self.tmp)}, "data": {"batch_size": 2}})
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        ok = subprocess.run([sys.executable, "-m", "wordle_mlx", "plan", "--config", str(sft), "--memory-gb", "16"],
                            capture_output=True, text=True, env=env, cwd=ROOT)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn("peak", ok.stdout)
        self.assertIn("largest data.batch_size within 10.7 GB (16 GB x 67%)", ok.stdout)
        self.assertIn("two thirds of memory up to 32 GB", ok.stdout)
        bad = write_json(self.tmp, "broken.json", "{not json")
        err = subprocess.run([sys.executable, "-m", "wordle_mlx", "plan", "--config", str(bad)],
                             capture_output=True, text=True, env=env, cwd=ROOT)
        self.assertEqual(err.returncode, 2)
        self.assertEqual(len(err.stderr.strip().splitlines()), 1, err.stderr)
        self.assertIn("broken.json", err.stderr)


if __name__ == "__main__":
    unittest.main()

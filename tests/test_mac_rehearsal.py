"""The Mac rehearsal: every stage on tiny checkpoints laid out like mlx-community/gemma-3-4b-it-bf16 and -4bit.

For each layout (float32, bfloat16, 4-bit made by mlx-lm's own quantizer; `tests/rehearsal/mac_layouts.py`) one class
runs `data`, `sft` (gradient checkpointing on), `train` (GRPO), `eval`, `play` and `fuse` with the configs the
recipe runner builds for the 4B model (`tests/rehearsal/recipe.py`), changing only the model path, the dtype for
the float32 layout, the output folders and the sizes (steps, batch, games, tokens), then loads the adapter and the
fused folder with plain `mlx_lm.load` and generates a few tokens. Each stage is its own test; a later stage reuses the earlier
stage's output (built once per class), so a failing stage fails its own test and those that need it.

How the GRPO update is made honest: a random model never plays a word, so every reply to a board scores the
same and plain GRPO skips the group. The rehearsal keeps the real sampler on the real layout but overwrites
the first reply to each board with a well-formed guess (`FirstReplyAWord`), so each group has a spread of
rewards and the step's rollouts go through the real `policy_update` with non-zero advantages (its old
log-probs are the trainer's own forward, not the sampler's); the test asserts that one update was applied (a
group trained, a non-zero gradient) and that the LoRA weights after GRPO differ from the SFT adapter they
started from.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
import unittest
from unittest import mock
from pathlib import Path

from tests.rehearsal.recipe import first_reply_a_word, recipe_config as recipe


class MacRehearsal:
    """Mixed into one unittest class per layout; KIND is "float32", "bfloat16" or "4bit"."""

    KIND = ""
    root: Path
    model: str
    dtype: str
    _done: dict

    @classmethod
    def setUpClass(cls):
        from tests.rehearsal.mac_layouts import make_mac_layout

        cls.root = Path(tempfile.mkdtemp(prefix=f"wordle-mlx-mac-{cls.KIND}-"))
        cls.model = str(make_mac_layout(cls.root / "model", cls.KIND))
        cls.dtype = "float32" if cls.KIND == "float32" else "bfloat16"
        cls._done = {}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def write(self, name: str, data: dict) -> Path:
        path = self.root / name
        path.write_text(json.dumps(data))
        return path

    def once(self, stage: str, run):
        """Run `stage` once per class and keep its result (a later stage's test reuses it)."""
        if stage not in self._done:
            self._done[stage] = run()
        return self._done[stage]

    # --- the stages, each run once -------------------------------------------------------------------------
    def data(self) -> dict:
        from wordle_mlx.config import load_config
        from wordle_mlx.stages import data

        cfg = self.write("data.json", recipe("data", out=str(self.root / "data"), train_examples=24,
                                             valid_examples=8, tokenizer=self.model, progress=False))
        return self.once("data", lambda: data.run(load_config(cfg, data.DataConfig)))

    def sft(self) -> dict:
        from wordle_mlx.config import load_config
        from wordle_mlx.stages import sft

        self.data()
        cfg = self.write("sft.json", recipe("sft", **{
            "model.name": self.model, "model.dtype": self.dtype, "data.folder": str(self.root / "data"),
            "run.logs_dir": str(self.root / "logs"), "run.steps": 2, "data.batch_size": 4, "validation.every": 2,
            "validation.batches": 1, "run.save_every": 2}))
        return self.once("sft", lambda: sft.run(load_config(cfg, sft.SFTConfig)))

    def train(self) -> dict:
        from wordle_mlx.config import load_config
        from wordle_mlx.stages import grpo

        adapters = self.sft()["adapters"]
        cfg = self.write("grpo.json", recipe("grpo-cover", **{
            "model.name": self.model, "model.dtype": self.dtype, "model.adapter": adapters,
            "run.logs_dir": str(self.root / "logs"), "run.steps": 1, "rl.batch_prompts": 2,
            "run.save_every": 0, "rl.num_generations": 2, "max_tokens": 8, "validation.every": 0}))

        def run():
            from wordle_mlx.llm.play import generation
            with mock.patch.object(grpo, "BatchedGenerator", first_reply_a_word(generation.BatchedGenerator)):
                return grpo.run(load_config(cfg, grpo.GRPOConfig))
        return self.once("train", run)

    # --- one test per stage ---------------------------------------------------------------------------------
    def test_0_layout_is_the_mac_repos(self):
        import mlx.core as mx

        config = json.loads((Path(self.model) / "config.json").read_text())
        self.assertEqual((config["model_type"], config["eos_token_id"]), ("gemma3", [1, 106]))
        self.assertEqual(config.get("quantization"), {"group_size": 64, "bits": 4, "mode": "affine"}
                         if self.KIND == "4bit" else None)
        for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "sliding_window", "rope_scaling", "query_pre_attn_scalar"):
            self.assertIn(key, config["text_config"])
        weights = {}
        for shard in Path(self.model).glob("model*.safetensors"):
            weights.update(mx.load(str(shard)))
        parts = {name.split(".")[0] for name in weights}
        self.assertEqual(parts, {"language_model", "vision_tower", "multi_modal_projector"})
        self.assertNotIn("language_model.lm_head.weight", weights)          # tied embeddings
        embed = weights["language_model.model.embed_tokens.weight"]
        self.assertEqual(embed.shape[0], 262_208)
        self.assertEqual(embed.dtype, {"float32": mx.float32, "bfloat16": mx.bfloat16, "4bit": mx.uint32}[self.KIND])

    def test_1_data(self):
        result = self.data()
        train = (self.root / "data" / "train.jsonl").read_text().splitlines()
        self.assertEqual(len(train), 24)
        self.assertIn("<guess> ", json.loads(train[0])["messages"][-1]["content"])
        self.assertTrue(result)

    def test_2_sft_with_grad_checkpoint(self):
        result = self.sft()
        saved = json.loads((Path(result["run"]) / "config.json").read_text())
        self.assertTrue(saved["model"]["grad_checkpoint"])
        self.assertEqual(result["step"], 2)
        self.assertTrue(0 < result["final_loss"] < 100)
        self.assertTrue((Path(result["adapters"]) / "adapters.safetensors").is_file())

    def test_3_train_applies_an_update(self):
        import mlx.core as mx
        import numpy as np

        result = self.train()
        last = result["last"]
        self.assertEqual(result["step"], 1)
        self.assertGreater(last["groups"], last["skipped_groups"])     # some group had a spread of rewards
        self.assertGreater(last["grad_norm"], 0.0)
        before = mx.load(str(Path(self.sft()["adapters"]) / "adapters.safetensors"))
        after = mx.load(str(Path(result["adapters"]) / "adapters.safetensors"))
        self.assertEqual(sorted(before), sorted(after))
        changed = [k for k in after if not np.array_equal(np.array(after[k].astype(mx.float32)),
                                                          np.array(before[k].astype(mx.float32)))]
        self.assertTrue(changed, "GRPO left every LoRA weight as the SFT adapter had it")
        self.assertTrue(all(v.dtype == mx.float32 for v in after.values()))

    def test_4_eval(self):
        from wordle_mlx.config import load_config
        from wordle_mlx.stages import evaluate

        out = self.root / "eval.json"
        cfg = self.write("eval-cfg.json", recipe("eval", **{
            "model": self.model, "dtype": self.dtype, "adapter": self.sft()["adapters"], "games": 2,
            "baselines": False, "out": str(out), "rollout.max_tokens_per_turn": 8, "progress": False}))
        with contextlib.redirect_stdout(io.StringIO()):
            evaluate.run(load_config(cfg, evaluate.EvalConfig))
        report = json.loads(out.read_text())
        self.assertEqual(report["games"], 2)
        self.assertEqual(report["model"], self.model)

    def test_5_play(self):
        from wordle_mlx.config import load_config
        from wordle_mlx.stages import play

        cfg = load_config(None, play.PlayConfig, {"model": self.model, "dtype": self.dtype, "secret": "crane",
                                                  "adapter": self.sft()["adapters"],
                                                  "rollout.max_tokens_per_turn": 8})
        result = play.run(cfg)
        self.assertEqual(result["secret"], "crane")
        self.assertFalse(result["won"])            # a random model

    def test_6_fuse_and_mlx_lm_load(self):
        """fuse, then plain mlx_lm.load of the fused folder and of base + adapter, each generating tokens."""
        import mlx_lm

        from wordle_mlx.config import load_config
        from wordle_mlx.stages import fuse

        adapters = self.train()["adapters"]
        out = self.root / "fused"
        # as the recipe's fuse stage fuses: a 4-bit base dequantized (re-quantizing rounds a small adapter away)
        cfg = load_config(None, fuse.FuseConfig, {"model": self.model, "adapter": adapters, "out": str(out),
                                                  "overwrite": True, "dequantize": self.KIND == "4bit"})
        result = fuse.run(cfg)
        self.assertLessEqual(result["max_abs_logit_diff"], result["tolerance"])
        for path, adapter in ((str(out), None), (self.model, adapters)):
            with self.subTest(model=path, adapter=adapter):
                model, tokenizer = mlx_lm.load(path, adapter_path=adapter)
                text = mlx_lm.generate(model, tokenizer, "Wordle:", max_tokens=4)
                self.assertGreater(len(tokenizer.encode(text, add_special_tokens=False)), 0)


class Float32LayoutTest(MacRehearsal, unittest.TestCase):
    KIND = "float32"


class BFloat16LayoutTest(MacRehearsal, unittest.TestCase):
    KIND = "bfloat16"


class FourBitLayoutTest(MacRehearsal, unittest.TestCase):
    KIND = "4bit"


if __name__ == "__main__":
    unittest.main()

"""The Gemma 3 4B recipe (config/gemma3-4b/, scripts/train_4b.sh): every config validates, each stage reads what
the one before writes, both variants differ only in the model, and the memory planner says each training
config fits its Mac (4-bit: 16 GB, bf16: 24 GB) with the real 4B dimensions."""

from __future__ import annotations

import json
import re
import tempfile
import unittest
from pathlib import Path

from tests.test_configs import check_stage_chain, dry_run
from wordle_mlx.config import load_config, resolve_path
from wordle_mlx.stages import plan
from wordle_mlx.stages.choice import ChoiceConfig
from wordle_mlx.stages.data import DataConfig
from wordle_mlx.stages.evaluate import EvalConfig
from wordle_mlx.stages.grpo_config import GRPOConfig
from wordle_mlx.stages.sft import SFTConfig

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "config" / "gemma3-4b"
SCRIPT = ROOT / "scripts" / "train_4b.sh"
VARIANTS = {"bf16": 24, "4bit": 16}
# mlx-community/gemma-3-4b-it-bf16's config.json, the keys that size the model
CONFIG_4B = {"model_type": "gemma3", "vocab_size": 262_208, "torch_dtype": "bfloat16", "eos_token_id": [1, 106],
             "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                             "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
                             "head_dim": 256, "sliding_window": 1024, "sliding_window_pattern": 6}}


def adapters_of(cfg) -> Path:
    return resolve_path(cfg, cfg.run.logs_dir).resolve() / cfg.run.name / "adapters"


def flat(config: dict, prefix: str = "") -> dict:
    """A config as {dotted key: value}."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


class RecipeConfigsTest(unittest.TestCase):
    def load(self, name: str, model):
        return load_config(RECIPE / name, model)

    def test_the_script_runs_every_stage_in_order_for_each_variant(self):
        for variant in ("bf16", "4bit"):
            with self.subTest(variant=variant):
                stages = dry_run("train_4b.sh", VARIANT=variant, W="true")   # `plan` lines call W outside stages
                self.assertEqual([name for name, _ in stages],
                                 ["setup", "data", "sft", "data-focus", "sft-focus", "data-fit", "sft-fit",
                                  "self-play", "sft-choice", "sft-choice2", "sft-choice3", "sft-choice4",
                                  "self-play-2", "cover", "sft-cover", "grpo", "self-play-3", "cover2", "sft-cover2",
                                  "self-play-4", "cover3", "sft-cover3", "eval-sft", "eval-sftcover", "eval-grpo",
                                  "eval-sftcover3", "fuse", "eval-fused"])
                check_stage_chain(self, [(n, c.replace("true ", "wordle-mlx ")) for n, c in stages])
                commands = dict(stages)
                self.assertEqual("--dequantize" in commands["fuse"], variant == "4bit")   # the fuse that passes
                fused = re.search(r"--out (\S+)", commands["fuse"])[1]
                self.assertIn(f"--model {fused} ", commands["eval-fused"])        # the fused folder, no adapter
                self.assertNotIn("--adapter", commands["eval-fused"])

    def test_the_recipe_is_the_270m_recipe_at_4b_scale(self):
        """Each 4B config is its 270M twin but for the model, its paths and run names, gradient checkpointing in
        SFT and train_layers 12 of 34 blocks where the 270M trains 6 of 18 (docs/RESULTS.md, "The 4B recipe")."""
        twins = {"sft": "sft", "sft-focus": "sft-focus", "sft-fit": "sft-fit", "sft-choice": "sft-choice",
                 "sft-choice-more": "sft-choice-more", "sft-cover": "sft-cover", "self-play": "self-play",
                 "self-play-2": "self-play-2", "grpo": "grpo-cover", "self-play-3": "self-play-3",
                 "self-play-4": "self-play-4", "sft-cover-2": "sft-cover-2", "sft-cover-3": "sft-cover-3"}
        paths = ("model", "model.name", "model.dtype", "model.adapter", "model.grad_checkpoint", "data.folder",
                 "run.name", "adapter", "out", "dtype")
        for stem, twin in twins.items():
            with self.subTest(config=stem):
                small = flat(json.loads((ROOT / "config" / "recipe-270m" / f"{twin}.json").read_text()))
                big = flat(json.loads((RECIPE / f"{stem}-bf16.json").read_text()))
                if "lora.train_layers" in small:
                    self.assertEqual((small["lora.train_layers"], big["lora.train_layers"]), (6, 12))
                    big["lora.train_layers"] = 6
                self.assertEqual({k: v for k, v in big.items() if k not in paths},
                                 {k: v for k, v in small.items() if k not in paths})
                if stem.startswith("sft"):
                    self.assertTrue(big["model.grad_checkpoint"])
                if stem == "grpo":
                    self.assertEqual(big["model.name"], "mlx-community/gemma-3-4b-it-bf16")
        for name in ("data.json", "data-focus.json", "data-fit.json"):
            small = json.loads((ROOT / "config" / "recipe-270m" / name).read_text())
            big = json.loads((RECIPE / name).read_text())
            self.assertEqual(dict(big, out=None), dict(small, out=None))

    def test_chain_per_variant(self):
        """data -> sft ... -> self-play-2 -> cover (the script's line) -> sft-cover -> grpo -> two more coverage
        rounds (self-play-3 -> cover2 -> sft-cover-2 -> self-play-4 -> cover3 -> sft-cover-3)."""
        data = self.load("data.json", DataConfig)
        self.assertEqual((data.prompt.style, data.prompt.guess_format, data.prompt.require_think),
                         ("compact", "letters", False))
        script = SCRIPT.read_text()
        cover = re.search(r'\$W data cover --data "(\S+)" --out "(\S+)"', script)
        self.assertIsNotNone(cover, "scripts/train_4b.sh: no `$W data cover --data A --out B` line")
        for v in VARIANTS:
            with self.subTest(variant=v):
                sft = self.load(f"sft-{v}.json", SFTConfig)
                self.assertEqual(sft.model.name, f"mlx-community/gemma-3-4b-it-{v}")
                self.assertEqual(resolve_path(sft, sft.data.folder).resolve(), resolve_path(data, data.out).resolve())
                fit = self.load(f"sft-fit-{v}.json", SFTConfig)
                play = self.load(f"self-play-{v}.json", ChoiceConfig)
                self.assertEqual(resolve_path(play, play.adapter).resolve(), adapters_of(fit))
                choice = self.load(f"sft-choice-{v}.json", SFTConfig)
                self.assertEqual(resolve_path(choice, choice.data.folder).resolve(),
                                 resolve_path(play, play.out).resolve())
                self.assertEqual(resolve_path(choice, choice.model.adapter).resolve(), adapters_of(fit))
                play2 = self.load(f"self-play-2-{v}.json", ChoiceConfig)
                cover_in, cover_out = (ROOT / cover[i].replace("$VARIANT", v) for i in (1, 2))
                self.assertEqual(cover_in.resolve(), resolve_path(play2, play2.out).resolve())
                last = self.load(f"sft-cover-{v}.json", SFTConfig)
                self.assertEqual(resolve_path(last, last.data.folder).resolve(), cover_out.resolve())
                self.assertEqual(resolve_path(last, last.model.adapter).resolve(),
                                 resolve_path(play2, play2.adapter).resolve())
                grpo = self.load(f"grpo-{v}.json", GRPOConfig)
                self.assertEqual(resolve_path(grpo, grpo.model.adapter).resolve(), adapters_of(last))
                self.assertEqual(grpo.optimizer.name, "sgd")
                self.assertEqual(self.load(f"eval-{v}.json", EvalConfig).rollout.prompt, data.prompt)
                adapter = adapters_of(grpo)       # two more coverage rounds, each from the adapter before
                for n in (2, 3):
                    play_n = self.load(f"self-play-{n + 1}-{v}.json", ChoiceConfig)
                    cover_n = self.load(f"sft-cover-{n}-{v}.json", SFTConfig)
                    self.assertEqual(resolve_path(play_n, play_n.adapter).resolve(), adapter)
                    self.assertEqual(resolve_path(cover_n, cover_n.model.adapter).resolve(), adapter)
                    self.assertEqual(resolve_path(play_n, play_n.out).resolve(),
                                     ROOT / "data" / "gemma3-4b" / f"self-play-{n + 1}-{v}")
                    self.assertEqual(resolve_path(cover_n, cover_n.data.folder).resolve(),
                                     ROOT / "data" / "gemma3-4b" / f"cover{n}-{v}")
                    self.assertTrue(cover_n.train_free)     # every coverage pass, as in the 270M recipe
                    adapter = adapters_of(cover_n)
        self.assertIn('--data "data/gemma3-4b/self-play-$((n + 1))-$VARIANT"', script)
        self.assertIn('--out "data/gemma3-4b/cover$n-$VARIANT"', script)
        self.assertIn('--adapter "logs/gemma3-4b-sft-cover3-$VARIANT/adapters"', script)   # what fuse reads

    def test_variants_differ_only_in_the_model(self):
        for stem in ("sft", "sft-focus", "sft-fit", "self-play", "sft-choice", "sft-choice-more", "self-play-2",
                     "sft-cover", "grpo", "self-play-3", "sft-cover-2", "self-play-4", "sft-cover-3", "eval"):
            with self.subTest(config=stem):
                text = {v: (RECIPE / f"{stem}-{v}.json").read_text() for v in VARIANTS}
                self.assertEqual(text["bf16"].replace("bf16", "4bit"), text["4bit"])

    def test_long_runs_show_their_progress(self):
        """No shipped config turns progress off, and neither recipe script passes --no-progress: a stage shows a bar
        with speed and ETA in a terminal, plain lines in a log (runtime/progress.py)."""
        def off(value) -> bool:
            if isinstance(value, dict):
                return value.get("progress") is False or any(off(v) for v in value.values())
            return False
        for path in sorted((ROOT / "config").rglob("*.json")):
            with self.subTest(config=str(path.relative_to(ROOT))):
                self.assertFalse(off(json.loads(path.read_text())))
        for script in ("recipe_stages.sh", "train_270m_cpu.sh", "train_4b.sh"):
            self.assertNotIn("--no-progress", (ROOT / "scripts" / script).read_text(), script)

    def test_planner_says_each_training_config_fits_its_mac(self):
        with tempfile.TemporaryDirectory() as tmp:
            for v, memory in VARIANTS.items():
                config = dict(CONFIG_4B, **({"quantization": {"group_size": 64, "bits": 4}} if v == "4bit" else {}))
                model_json = Path(tmp) / f"{v}.json"
                model_json.write_text(json.dumps(config))
                for stem in ("sft", "sft-focus", "sft-fit", "sft-choice", "sft-choice-more", "sft-cover", "grpo",
                             "sft-cover-3"):
                    with self.subTest(config=f"{stem}-{v}"):
                        result = plan.run(plan.PlanConfig(config=str(RECIPE / f"{stem}-{v}.json"),
                                                          model_json=str(model_json), memory_gb=memory,
                                                          json_output=True))
                        self.assertIn(memory, result["fits_mac_gb"])
                        self.assertGreater(result["peak_gb"], 2.0)     # at least the 4-bit weights


if __name__ == "__main__":
    unittest.main()

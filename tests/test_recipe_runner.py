"""`wordle-mlx recipe` (wordle_mlx/stages/recipe*.py) and config/recipe.json: a bad recipe is a one-line error;
every stage of the 270M chain gets exactly the config the shell recipe of an earlier version gave it (its configs
and flags, checked equal field by field before they were deleted, are frozen below as what differs from each
stage's defaults); a stage's snapshot leaves unset what the chain does not set, so an eval plays the decoding its
adapter records; GRPO validates from step 0; `--model` derives the 4B settings; `--dry-run` ends
`stages N peak_gb X` with no model on disk; and a tiny recipe killed with SIGKILL mid-SFT and run again finishes
with the same adapter, bit for bit, and the same losses as an uninterrupted run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
from typer.testing import CliRunner

from wordle_mlx.cli import app
from wordle_mlx.config import load_config, resolve_path
from wordle_mlx.runtime import device
from wordle_mlx.storage.metrics import read_jsonl
from wordle_mlx.stages.choice_config import ChoiceConfig
from wordle_mlx.stages.cover import CoverConfig
from wordle_mlx.stages.data import DataConfig
from wordle_mlx.stages.eval_config import EvalConfig
from wordle_mlx.stages.grpo_config import GRPOConfig
from wordle_mlx.stages.recipe_build import CONFIG_MODELS, PATH_FIELDS, build_chain, write_snapshot
from wordle_mlx.stages.recipe_file import expand, load_recipe
from wordle_mlx.stages.recipe_model import model_settings
from wordle_mlx.stages.recipe_run import resume_flags
from wordle_mlx.stages.sft_config import SFTConfig

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "config" / "recipe.json"
LAST_LINE = r"^stages \d+ peak_gb \d+\.\d+$"


@contextlib.contextmanager
def working_folder(path: Path):
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def offline_env(tmp: str) -> dict:
    """No Hugging Face cache, no network, an empty wordle-mlx cache (no model on disk)."""
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(Path(tmp) / "hf"), "WORDLE_MLX_CACHE": str(Path(tmp) / "cache")}


def normalised(cfg, kind: str) -> dict:
    """The config's dump with every path field resolved (absolute), so the folder a path is written against does
    not matter."""
    data = cfg.model_dump(mode="json")
    for dotted in PATH_FIELDS.get(kind, ()):
        node, *rest = dotted.split(".")
        holder, key = (data[node], rest[0]) if rest else (data, node)
        if holder.get(key) is not None:
            holder[key] = str(resolve_path(cfg, holder[key]).resolve())
    return data


def flat(data: dict, prefix: str = "") -> dict:
    """A config dump as {dotted key: value}."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def differences(cfg, kind: str) -> dict:
    """What a stage config sets that its kind's defaults do not, paths relative to the checkout."""
    with working_folder(ROOT):
        defaults, got = flat(normalised(CONFIG_MODELS[kind](), kind)), flat(normalised(cfg, kind))
    return {k: os.path.relpath(v, ROOT) if isinstance(v, str) and v.startswith(f"{ROOT}/") else v
            for k, v in got.items() if defaults.get(k, object()) != v}


# Every 270M stage's config as the shell recipe (scripts/train_270m_cpu.sh with config/recipe-270m/) ran it, as
# what differs from the stage kind's defaults; the runner's configs were checked equal to the shell's, field by
# field, before those files were deleted. eval-shipped-seeded is the guard's seeded setting, added since.
CHAIN_270M = {
    'entropy': {'top': 5},
    'data': {},
    'sft': {'run.name': 'sft-270m', 'decode': 'grammar'},
    'data-focus': {'out': 'data/sft-focus', 'seed': 1, 'train_examples': 1500, 'empty_board_copies': 3},
    'sft-focus': {'model.adapter': 'logs/sft-270m/adapters', 'lora.train_layers': 6,
                  'optimizer.learning_rate': 0.0001, 'run.name': 'sft-focus-270m', 'run.steps': 270,
                  'run.save_every': 25, 'decode': 'grammar', 'validation.every': 50, 'data.folder': 'data/sft-focus'},
    'data-fit': {'out': 'data/sft-fit', 'seed': 2, 'train_examples': 100, 'valid_examples': 60,
                 'empty_board_copies': 1, 'empty_board_traffic_cap': 16},
    'sft-fit': {'model.adapter': 'logs/sft-focus-270m/adapters', 'lora.train_layers': 6,
                'optimizer.learning_rate': 3e-05, 'optimizer.warmup_steps': 10, 'optimizer.min_lr_ratio': 0.5,
                'run.name': 'sft-fit-270m', 'run.steps': 260, 'decode': 'grammar', 'validation.every': 50,
                'data.folder': 'data/sft-fit'},
    'choice': {'adapter': 'logs/sft-fit-270m/adapters', 'out': 'data/choice', 'decode': 'words'},
    'sft-choice': {'model.adapter': 'logs/sft-fit-270m/adapters', 'lora.train_layers': 6,
                   'optimizer.learning_rate': 3e-05, 'optimizer.warmup_steps': 5, 'optimizer.min_lr_ratio': 0.5,
                   'run.name': 'sft-choice-270m', 'run.steps': 240, 'decode': 'words', 'validation.every': 80,
                   'data.folder': 'data/choice'},
    'sft-choice2': {'model.adapter': 'logs/sft-choice-270m/adapters', 'lora.train_layers': 6,
                    'optimizer.learning_rate': 1.5e-05, 'optimizer.warmup_steps': 0, 'optimizer.min_lr_ratio': 1.0,
                    'run.name': 'sft-choice2-270m', 'run.steps': 120, 'run.seed': 1, 'decode': 'words',
                    'data.folder': 'data/choice'},
    'sft-choice3': {'model.adapter': 'logs/sft-choice2-270m/adapters', 'lora.train_layers': 6,
                    'optimizer.learning_rate': 1.5e-05, 'optimizer.warmup_steps': 0, 'optimizer.min_lr_ratio': 1.0,
                    'run.name': 'sft-choice3-270m', 'run.steps': 240, 'run.seed': 2, 'run.save_every': 40,
                    'decode': 'words', 'data.folder': 'data/choice'},
    'sft-choice4': {'model.adapter': 'logs/sft-choice3-270m/adapters', 'lora.train_layers': 6,
                    'optimizer.learning_rate': 1.5e-05, 'optimizer.warmup_steps': 0, 'optimizer.min_lr_ratio': 1.0,
                    'run.name': 'sft-choice4-270m', 'run.steps': 240, 'run.seed': 3, 'run.save_every': 40,
                    'decode': 'words', 'data.folder': 'data/choice'},
    'choice2': {'adapter': 'logs/sft-choice4-270m/adapters', 'out': 'data/choice2', 'decode': 'words'},
    'cover': {'data': 'data/choice2', 'out': 'data/choice2-cover5c4'},
    'sft-cover': {'model.adapter': 'logs/sft-choice4-270m/adapters', 'lora.train_layers': 6,
                  'optimizer.learning_rate': 1.5e-05, 'optimizer.warmup_steps': 0, 'optimizer.min_lr_ratio': 1.0,
                  'run.name': 'sft-cover-270m', 'run.steps': 240, 'run.seed': 5, 'run.save_every': 40,
                  'decode': 'words', 'data.folder': 'data/choice2-cover5c4', 'train_free': True},
    'grpo-cover': {'model.adapter': 'logs/sft-cover-270m/adapters', 'run.name': 'grpo-cover-270m', 'decode': 'words'},
    'choice3': {'adapter': 'logs/grpo-cover-270m/adapters', 'out': 'data/choice3', 'decode': 'words'},
    'cover2': {'data': 'data/choice3', 'out': 'data/choice3-cover5c4'},
    'sft-cover2': {'model.adapter': 'logs/grpo-cover-270m/adapters', 'lora.train_layers': 6,
                   'optimizer.learning_rate': 1.5e-05, 'optimizer.warmup_steps': 0, 'optimizer.min_lr_ratio': 1.0,
                   'run.name': 'sft-cover2-270m', 'run.steps': 240, 'run.seed': 5, 'run.save_every': 40,
                   'decode': 'words', 'data.folder': 'data/choice3-cover5c4', 'train_free': True},
    'choice4': {'adapter': 'logs/sft-cover2-270m/adapters', 'out': 'data/choice4', 'decode': 'words'},
    'cover3': {'data': 'data/choice4', 'out': 'data/choice4-cover5c4'},
    'sft-cover3': {'model.adapter': 'logs/sft-cover2-270m/adapters', 'lora.train_layers': 6,
                   'optimizer.learning_rate': 1.5e-05, 'optimizer.warmup_steps': 0, 'optimizer.min_lr_ratio': 1.0,
                   'run.name': 'sft-cover3-270m', 'run.steps': 240, 'run.seed': 5, 'run.save_every': 40,
                   'decode': 'words', 'data.folder': 'data/choice4-cover5c4', 'train_free': True},
    'eval-base-greedy': {'out': 'logs/recipe-270m/eval_base_greedy.json'},
    'eval-sft1-greedy': {'adapter': 'logs/sft-270m/adapters', 'baselines': False,
                         'out': 'logs/recipe-270m/eval_sft1_greedy.json'},
    'eval-sft2-greedy': {'adapter': 'logs/sft-focus-270m/adapters', 'baselines': False,
                         'out': 'logs/recipe-270m/eval_sft2_greedy.json'},
    'eval-fit-greedy': {'adapter': 'logs/sft-fit-270m/adapters', 'baselines': False,
                        'out': 'logs/recipe-270m/eval_fit_greedy.json'},
    'eval-sftchoice-greedy': {'adapter': 'logs/sft-choice4-270m/adapters', 'baselines': False,
                              'out': 'logs/recipe-270m/eval_sftchoice_greedy.json'},
    'eval-sftcover-greedy': {'adapter': 'logs/sft-cover-270m/adapters', 'baselines': False,
                             'out': 'logs/recipe-270m/eval_sftcover_greedy.json'},
    'eval-grpocover-greedy': {'adapter': 'logs/grpo-cover-270m/adapters', 'baselines': False,
                              'out': 'logs/recipe-270m/eval_grpocover_greedy.json'},
    'eval-sftcover2-greedy': {'adapter': 'logs/sft-cover2-270m/adapters', 'baselines': False,
                              'out': 'logs/recipe-270m/eval_sftcover2_greedy.json'},
    'eval-sftcover3-greedy': {'adapter': 'logs/sft-cover3-270m/adapters', 'baselines': False,
                              'out': 'logs/recipe-270m/eval_sftcover3_greedy.json'},
    'eval-sftcover3-free': {'adapter': 'logs/sft-cover3-270m/adapters', 'rollout.decode': 'free', 'baselines': False,
                            'out': 'logs/recipe-270m/eval_sftcover3_greedy_free.json'},
    'eval-sftcover-seeded': {'adapter': 'logs/sft-cover-270m/adapters', 'history': 'seeded', 'baselines': False,
                             'out': 'logs/recipe-270m/eval_sftcover_seeded.json'},
    'eval-grpocover-seeded': {'adapter': 'logs/grpo-cover-270m/adapters', 'history': 'seeded', 'baselines': False,
                              'out': 'logs/recipe-270m/eval_grpocover_seeded.json'},
    'eval-sftcover2-seeded': {'adapter': 'logs/sft-cover2-270m/adapters', 'history': 'seeded', 'baselines': False,
                              'out': 'logs/recipe-270m/eval_sftcover2_seeded.json'},
    'eval-sftcover3-seeded': {'adapter': 'logs/sft-cover3-270m/adapters', 'history': 'seeded', 'baselines': False,
                              'out': 'logs/recipe-270m/eval_sftcover3_seeded.json'},
    'eval-shipped-words': {'adapter': 'adapters/gemma-3-270m-wordle', 'rollout.decode': 'words', 'baselines': False,
                           'out': 'logs/recipe-270m/eval_shipped_greedy_words.json'},
    'eval-shipped-free': {'adapter': 'adapters/gemma-3-270m-wordle', 'rollout.decode': 'free', 'baselines': False,
                          'out': 'logs/recipe-270m/eval_shipped_greedy_free.json'},
    'eval-shipped-seeded': {'adapter': 'adapters/gemma-3-270m-wordle', 'history': 'seeded', 'rollout.decode': 'words',
                            'baselines': False, 'out': 'logs/recipe-270m/eval_shipped_seeded.json'},
}


class RecipeFileErrorsTest(unittest.TestCase):
    def check(self, recipe: dict, *fragments: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "recipe.json"
            path.write_text(json.dumps(recipe))
            with mock.patch.dict(os.environ, offline_env(tmp)), working_folder(Path(tmp)):
                result = CliRunner().invoke(app, ["recipe", str(path), "--dry-run"])
            self.assertEqual(result.exit_code, 2, result.output)
            lines = result.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, result.stderr)
            self.assertNotIn("Traceback", result.stderr)
            for fragment in (str(path), *fragments):
                self.assertIn(fragment, lines[0])

    def test_unknown_stage_kind(self):
        self.check({"stages": [{"stage": "data", "kind": "data"}, {"stage": "x", "kind": "sftt"}]},
                   "stages.1.kind", "unknown stage kind", "'sftt'")

    def test_unknown_field_of_a_stage(self):
        self.check({"stages": [{"stage": "data", "kind": "data", "seeds": 3}]}, "stages.0.seeds", "unknown field",
                   "(got 3)")

    def test_unknown_field_of_a_stage_config(self):
        self.check({"stages": [{"stage": "data", "kind": "data", "config": {"history": {"k": [1]}}}]},
                   "stage data", "history.k", "unknown field", "[1]")

    def test_unknown_top_level_field(self):
        self.check({"stages": [{"stage": "data", "kind": "data"}], "stagez": []}, "stagez", "unknown field")

    def test_a_derived_path_is_not_written_by_hand(self):
        self.check({"stages": [{"stage": "data", "kind": "data"}, {"stage": "sft", "kind": "sft", "config": {
            "data": {"folder": "data/mine"}}}]}, "stage sft", "config.data.folder", "'data/mine'")

    def test_per_round_list_of_the_wrong_length(self):
        self.check({"stages": [{"kind": "rounds", "count": 3, "stages": [
            {"stage": "data", "kind": "data", "per_round": {"seed": [1, 2]}}]}]},
                   "stages.0.stages.0.per_round.seed", "[1, 2]")


class RecipeChainTest(unittest.TestCase):
    """The config the runner builds for each stage of the 270M chain is the one frozen above, with paths compared
    resolved."""

    def chain(self) -> list:
        with working_folder(ROOT):
            recipe = load_recipe(RECIPE)
            settings = model_settings("builtin:gemma-3-270m")
            return build_chain(recipe, expand(recipe, settings.size), settings, ship_exists=True)

    def test_every_stage_of_the_270m_chain_is_the_shell_recipes(self):
        stages = self.chain()
        names = [s.name for s in stages]
        self.assertEqual(names[:23], [
            "model", "entropy", "data", "sft", "data-focus", "sft-focus", "data-fit", "sft-fit", "choice",
            "sft-choice", "sft-choice2", "sft-choice3", "sft-choice4", "choice2", "cover", "sft-cover", "grpo-cover",
            "choice3", "cover2", "sft-cover2", "choice4", "cover3", "sft-cover3"])
        self.assertEqual(names[-5:], ["plots", "eval-shipped-words", "eval-shipped-free", "eval-shipped-seeded",
                                      "ship"])
        self.assertEqual(len([n for n in names if n.startswith("eval-")]), 14 + 3)   # the guard's 3
        configs = {s.name: s for s in stages if s.config is not None and s.kind != "ship"}
        self.assertEqual(list(configs), list(CHAIN_270M))
        for name, stage in configs.items():
            with self.subTest(stage=name):
                self.assertEqual(differences(stage.config, stage.kind), CHAIN_270M[name])
        by_name = {s.name: s for s in stages}
        self.assertEqual(by_name["model"].commands, [["model", "import", "builtin:gemma-3-270m"]])
        self.assertEqual(by_name["entropy"].commands, [["entropy", "--top", "5"]])
        with tempfile.TemporaryDirectory() as tmp, working_folder(Path(tmp)):
            self.assertEqual(resume_flags(by_name["sft-fit"]), ["--overwrite"])          # a fresh run folder
            (Path(tmp) / "logs" / "sft-fit-270m" / "checkpoints" / "step_000020").mkdir(parents=True)
            self.assertEqual(resume_flags(by_name["sft-fit"]), ["--resume", "logs/sft-fit-270m"])

    def test_the_ship_stage_guards_and_packages_the_last_pass(self):
        ship = self.chain()[-1]
        self.assertEqual(ship.script[1:], ["scripts/ship_adapter.py", "--config", "logs/recipe-270m/configs/ship.json"])
        cfg = ship.config
        self.assertEqual((cfg.adapter, cfg.out, cfg.recipe, cfg.markers),
                         ("logs/sft-cover3-270m/adapters", "adapters/gemma-3-270m-wordle", str(RECIPE),
                          "logs/recipe-270m"))
        self.assertEqual(list(cfg.stages)[:2], ["model", "entropy"])          # every stage from the base model on
        self.assertEqual(list(cfg.stages)[-1], "eval-shipped-seeded")
        self.assertEqual(len(cfg.evals), 17)                                  # every eval of the run
        self.assertEqual([(g.setting, g.primary, Path(g.new).name, Path(g.shipped).name) for g in cfg.guard], [
            ("words", True, "eval_sftcover3_greedy.json", "eval_shipped_greedy_words.json"),
            ("free", False, "eval_sftcover3_greedy_free.json", "eval_shipped_greedy_free.json"),
            ("seeded", False, "eval_sftcover3_seeded.json", "eval_shipped_seeded.json")])
        with working_folder(ROOT):
            recipe = load_recipe(RECIPE)
            settings = model_settings("builtin:gemma-3-270m")
            fresh = build_chain(recipe, expand(recipe, settings.size), settings, ship_exists=False)
        self.assertNotIn("eval-shipped-words", [s.name for s in fresh])      # nothing in the tree: no guard
        self.assertEqual(fresh[-1].config.guard, [])

    def test_grpo_validates_from_step_0_and_keeps_the_best(self):
        """The trainer plays the validation games before the first step and keeps the pass with the most wins
        when validation.every and games are > 0 (`trainer.train`, keep_best); the recipe refuses a GRPO stage
        without them."""
        grpo = {s.name: s for s in self.chain()}["grpo-cover"].config
        self.assertGreater(grpo.validation.every, 0)
        self.assertEqual(grpo.validation.games, 100)
        self.assertEqual(grpo.run.steps % grpo.validation.every, 0)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "recipe.json"
            path.write_text(json.dumps({"stages": [{"stage": "g", "kind": "grpo", "start": None,
                                                    "config": {"validation": {"every": 0}}}]}))
            with mock.patch.dict(os.environ, offline_env(tmp)), working_folder(Path(tmp)):
                result = CliRunner().invoke(app, ["recipe", str(path), "--dry-run"])
        self.assertEqual(result.exit_code, 2, result.output)
        self.assertIn("stage g: config.validation.every: a recipe's GRPO stage is validated from step 0",
                      result.stderr)

    def test_snapshots_read_back_as_built(self):
        """What a stage's child process loads (`--config` snapshot, paths relative to its folder) is the config the
        runner built, paths and all."""
        models = {"data": DataConfig, "sft": SFTConfig, "grpo": GRPOConfig, "self-play": ChoiceConfig,
                  "cover": CoverConfig, "eval": EvalConfig}
        with tempfile.TemporaryDirectory() as tmp, working_folder(Path(tmp)):
            recipe = load_recipe(RECIPE)
            settings = model_settings("builtin:gemma-3-270m")
            for stage in build_chain(recipe, expand(recipe, settings.size), settings, ship_exists=True):
                if stage.kind in models:
                    with self.subTest(stage=stage.name):
                        path = write_snapshot(stage, settings.markers)
                        self.assertEqual(path, Path("logs/recipe-270m/configs") / f"{stage.name}.json")
                        loaded = load_config(path, models[stage.kind])
                        self.assertEqual(normalised(loaded, stage.kind), normalised(stage.config, stage.kind))
                        text = path.read_text()
                        self.assertNotIn(tmp, text)                      # relative: the run folder can move
                        if stage.kind == "eval":        # an adapter's own decoding and prompt unless the stage sets one
                            forced = stage.name.endswith(("-free", "-words")) or stage.name in (
                                "eval-shipped-words", "eval-shipped-seeded")
                            self.assertEqual("decode" in loaded.rollout.model_fields_set, forced)
                            self.assertEqual("prompt" in loaded.rollout.model_fields_set, loaded.adapter is None)


class ModelDerivationTest(unittest.TestCase):
    def chain(self, model: str, dtype: str | None = None, memory_gb: float | None = None):
        with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, offline_env(tmp)), \
                working_folder(Path(tmp)):
            recipe = load_recipe(RECIPE)
            settings = model_settings(model, dtype, memory_gb)
            return settings, {s.name: s for s in build_chain(recipe, expand(recipe, settings.size), settings)}

    def test_4b_settings_derive_from_the_model(self):
        for variant, memory in (("bf16", 24), ("4bit", 16)):
            with self.subTest(variant=variant):
                settings, stages = self.chain(f"mlx-community/gemma-3-4b-it-{variant}", "bfloat16", memory)
                self.assertEqual((settings.layers, settings.tag, str(settings.markers)),
                                 (34, f"4b-{variant}", f"logs/recipe-4b-{variant}"))
                sft = [s for s in stages.values() if s.kind == "sft"]
                self.assertEqual({s.config.lora.train_layers for s in sft if s.name != "sft"}, {12})   # of 34
                self.assertIsNone(stages["sft"].config.lora.train_layers)
                self.assertEqual({s.config.model.dtype for s in sft}, {"bfloat16"})
                # the planner at this memory: the first SFT (all blocks train) does not fit without checkpointing,
                # the later passes (12 blocks) and GRPO do
                self.assertTrue(stages["sft"].config.model.grad_checkpoint)
                self.assertFalse(stages["sft-focus"].config.model.grad_checkpoint)
                self.assertFalse(stages["grpo-cover"].config.model.grad_checkpoint)
                fuse = stages["fuse"]
                self.assertEqual(fuse.config.dequantize, variant == "4bit")
                self.assertEqual("--dequantize" in fuse.commands[0], variant == "4bit")
                fused = stages["eval-fused-greedy"].config
                self.assertEqual((fused.model, fused.adapter, fused.rollout.decode),
                                 (f"logs/recipe-4b-{variant}/fused", None, "words"))
                self.assertNotIn("ship", stages)
                self.assertNotIn("eval-base-greedy", stages)
                self.assertEqual(stages["sft"].config.data.folder, f"data/4b-{variant}/sft")

    def test_dtype_is_the_machines_unless_given(self):
        settings, stages = self.chain("mlx-community/gemma-3-4b-it-bf16")
        self.assertEqual(settings.dtype, device.default_dtype())
        self.assertIsNone(stages["sft"].config.model.dtype)          # the machine's own: float32 on CPU
        with mock.patch.object(device, "has_gpu", return_value=True), \
                mock.patch.dict(os.environ, {device.DTYPE_ENV: ""}):
            gpu, _ = self.chain("mlx-community/gemma-3-4b-it-bf16")
        self.assertEqual(gpu.dtype, "bfloat16")                         # a Mac computes in bfloat16

    def test_270m_trains_the_last_6_of_18_blocks(self):
        settings, stages = self.chain("builtin:gemma-3-270m")
        self.assertEqual((settings.layers, settings.train_layers(load_recipe(RECIPE).share())), (18, 6))
        self.assertNotIn("fuse", stages)


class DryRunTest(unittest.TestCase):
    def test_last_line_with_no_model_on_disk(self):
        for model in ("builtin:gemma-3-270m", "mlx-community/gemma-3-4b-it-bf16", "mlx-community/gemma-3-4b-it-4bit"):
            with self.subTest(model=model), tempfile.TemporaryDirectory() as tmp, \
                    mock.patch.dict(os.environ, offline_env(tmp)), working_folder(Path(tmp)):
                result = CliRunner().invoke(app, ["recipe", str(RECIPE), "--model", model, "--dry-run"])
                self.assertEqual(result.exit_code, 0, result.output)
                last = result.stdout.strip().splitlines()[-1]
                self.assertRegex(last, LAST_LINE)
                self.assertGreater(float(last.split()[-1]), 0.5)
                self.assertFalse((Path(tmp) / "logs").exists())             # nothing written
                self.assertFalse(any((Path(tmp) / "cache").glob("models/*")))

    def test_until_names_a_stage(self):
        with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, offline_env(tmp)), \
                working_folder(Path(tmp)):
            result = CliRunner().invoke(app, ["recipe", str(RECIPE), "--dry-run", "--until", "sft-fit"])
            self.assertEqual(result.exit_code, 0, result.output)
            self.assertEqual(result.stdout.strip().splitlines()[-1].split()[:2], ["stages", "8"])
            bad = CliRunner().invoke(app, ["recipe", str(RECIPE), "--dry-run", "--until", "sft-fitt"])
            self.assertEqual(bad.exit_code, 2)
            self.assertIn("--until sft-fitt: not a stage", bad.stderr)


TINY_RECIPE = {"stages": [
    {"stage": "data", "kind": "data", "config": {"train_examples": 8, "valid_examples": 4}},
    {"stage": "sft", "kind": "sft", "config": {
        "data": {"batch_size": 2}, "run": {"steps": 6, "save_every": 1}, "optimizer": {"learning_rate": 1e-2,
                                                                                      "warmup_steps": 1},
        "validation": {"every": 0}, "lora": {"rank": 4, "dropout": 0.1}}}]}
TINY = "builtin:tiny-random"


class KilledRecipeResumesTest(unittest.TestCase):
    """The real CLI in temp folders: an uninterrupted tiny recipe; the same stages typed as plain `wordle-mlx`
    commands (as the shell recipe ran them); and the recipe with its process group killed by SIGKILL once SFT
    has a checkpoint, then run again. All three end with the same adapter, bit for bit, and the same losses."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.full = Path(cls.tmp.name)
        proc = cls.recipe(cls.full)
        cls.full_output, _ = proc.communicate(timeout=600)
        cls.full_status = proc.returncode

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @staticmethod
    def env() -> dict:
        return {**os.environ, "PYTHONPATH": str(ROOT)}

    @classmethod
    def recipe(cls, folder: Path, **popen) -> subprocess.Popen:
        (folder / "recipe.json").write_text(json.dumps(TINY_RECIPE))
        return subprocess.Popen([sys.executable, "-m", "wordle_mlx", "recipe", "recipe.json", "--model", TINY,
                                 "--no-progress"], cwd=folder, env=cls.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, **popen)

    def finish(self, folder: Path) -> str:
        proc = self.recipe(folder)
        out, _ = proc.communicate(timeout=600)
        self.assertEqual(proc.returncode, 0, out[-3000:])
        return out

    @staticmethod
    def losses(run: Path) -> dict[int, float]:
        return {r["step"]: r["loss"] for _, r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "train"}

    def assert_same_run(self, run: Path) -> None:
        reference = self.full / "logs" / "sft-tiny-random"
        wa = mx.load(str(reference / "adapters" / "adapters.safetensors"))
        wb = mx.load(str(run / "adapters" / "adapters.safetensors"))
        self.assertEqual(set(wa), set(wb))
        for key in wa:
            self.assertTrue(mx.array_equal(wa[key], wb[key]).item(), key)       # bit for bit
        self.assertEqual(self.losses(reference), self.losses(run))
        self.assertEqual(sorted(self.losses(run)), list(range(1, 7)))

    def test_uninterrupted_run_prints_each_stage_and_skips_it_next_time(self):
        self.assertEqual(self.full_status, 0, self.full_output[-3000:])
        self.assertRegex(self.full_output, r"== data: \d+s, 8 train examples")
        self.assertRegex(self.full_output, r"== sft: \d+s, loss \d+\.\d+")
        markers = self.full / "logs" / "recipe-tiny-random"
        self.assertGreater(int((markers / "sft.done").read_text()), 0)
        snapshot = json.loads((markers / "configs" / "sft.json").read_text())
        self.assertEqual(snapshot["data"]["folder"], "../../../data/tiny-random/sft")
        with tempfile.TemporaryDirectory() as tmp:           # done stages are skipped (a copy: other tests read it)
            copy = Path(tmp) / "copy"
            shutil.copytree(self.full, copy)
            again = self.finish(copy)
            self.assertIn("== data: done earlier, skipped", again)
            self.assertIn("== sft: done earlier, skipped", again)

    def test_the_same_stages_as_plain_commands_train_the_same_adapter(self):
        sft = dict(TINY_RECIPE["stages"][1]["config"])
        sft.update(model={"name": TINY}, data={"folder": "data/sft", "batch_size": 2},
                   run={**sft["run"], "logs_dir": "logs", "name": "sft-tiny-random"})
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "data.json").write_text(json.dumps({"out": "data/sft", **TINY_RECIPE["stages"][0]["config"]}))
            (folder / "sft.json").write_text(json.dumps(sft))
            for words in (["data", "--config", "data.json"], ["sft", "--config", "sft.json", "--overwrite"]):
                done = subprocess.run([sys.executable, "-m", "wordle_mlx", *words, "--no-progress"], cwd=folder,
                                      env=self.env(), capture_output=True, text=True, timeout=600)
                self.assertEqual(done.returncode, 0, done.stderr[-2000:])
            self.assert_same_run(folder / "logs" / "sft-tiny-random")

    def test_ctrl_c_stops_the_stage_after_its_step_and_the_next_run_goes_on(self):
        """SIGINT to the process group, as a terminal's Ctrl-C: the runner waits, the child stops with a checkpoint,
        the runner exits with its status (130) and keeps the seconds so far in sft.partial."""
        with tempfile.TemporaryDirectory() as tmp:
            cut = Path(tmp)
            proc = self.recipe(cut, start_new_session=True)
            run, markers = cut / "logs" / "sft-tiny-random", cut / "logs" / "recipe-tiny-random"
            deadline = time.time() + 600
            while time.time() < deadline and proc.poll() is None:
                if (run / "checkpoints" / "latest").is_file():
                    os.killpg(proc.pid, signal.SIGINT)
                    break
                time.sleep(0.01)
            out, _ = proc.communicate(timeout=120)
            if proc.returncode == 0:
                self.skipTest("the tiny run finished before the poll saw its first checkpoint")
            self.assertEqual(proc.returncode, 130, out[-2000:])
            self.assertIn("recipe stopped in stage sft (status 130", out)
            self.assertTrue((markers / "sft.partial").is_file())
            self.assertFalse((markers / "sft.done").is_file())
            self.finish(cut)
            self.assertFalse((markers / "sft.partial").is_file())
            self.assert_same_run(run)

    def test_sigkill_mid_sft_then_resume_matches_uninterrupted(self):
        with tempfile.TemporaryDirectory() as tmp:
            cut = Path(tmp)
            proc = self.recipe(cut, start_new_session=True)
            run = cut / "logs" / "sft-tiny-random"
            deadline = time.time() + 600
            while time.time() < deadline and proc.poll() is None:
                if (run / "checkpoints" / "latest").is_file():
                    os.killpg(proc.pid, signal.SIGKILL)                    # the runner and its sft child
                    break
                time.sleep(0.01)
            proc.communicate(timeout=60)
            killed = proc.returncode == -signal.SIGKILL
            markers = cut / "logs" / "recipe-tiny-random"
            if killed:                       # (a tiny run may finish before the poll sees its first checkpoint)
                self.assertTrue((markers / "data.done").is_file())         # the stage before stays done
                self.assertFalse((markers / "sft.done").is_file())
            out = self.finish(cut)
            self.assertIn("== data: done earlier, skipped", out)
            if killed:
                runs = [r for _, r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "run"]
                self.assertGreaterEqual(runs[-1]["resumed_from_step"], 1, out[-2000:])
            self.assert_same_run(run)


if __name__ == "__main__":
    unittest.main()

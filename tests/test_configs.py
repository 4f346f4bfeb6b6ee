"""Every shipped config in config/ validates against its stage's model, and its paths resolve sensibly; config/ is
what a user edits (at most 10 files, none a copy of another for another model); an old or misspelt field is a
one-line error; `train --print-config` stays within 40 settings; the 270M chain the recipe runner builds from
config/recipe.json reads what its stages write, trains words decoding and guards what it ships."""

from __future__ import annotations

import json
import os
import re
import tempfile
import unittest
from pathlib import Path

from typer.testing import CliRunner

from wordle_mlx.cli import app
from wordle_mlx.config import load_config, resolve_path
from wordle_mlx.errors import UserError
from wordle_mlx.stages.choice import ChoiceConfig
from wordle_mlx.stages.data import DataConfig
from wordle_mlx.stages.evaluate import EvalConfig
from wordle_mlx.stages.grpo import GRPOConfig
from wordle_mlx.stages.recipe_file import RecipeFile
from wordle_mlx.stages.sft import SFTConfig
from wordle_mlx.stages.train_config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"
RECIPE = CONFIG / "recipe.json"
DEMO = CONFIG / "demo"
# a config's stage, from the start of its file name (config/<purpose>/<stage>[-variant].json)
MODELS = {"data": DataConfig, "sft": SFTConfig, "grpo": GRPOConfig, "eval": EvalConfig, "self-play": ChoiceConfig,
          "recipe": RecipeFile}


def model_for(path: Path):
    for prefix, model in MODELS.items():
        if path.stem.startswith(prefix):
            return model
    raise AssertionError(f"{path}: no stage model known for this name (expected one of {', '.join(MODELS)}...)")


def chain_270m() -> dict:
    """{stage: Stage} of config/recipe.json for the builtin 270M, built as `wordle-mlx recipe` builds it (paths
    relative to the checkout), with the guard of an adapter already shipped."""
    from wordle_mlx.stages.recipe import build_stages

    before = os.getcwd()
    os.chdir(ROOT)
    try:
        _, stages = build_stages(str(RECIPE), ship_exists=True)
    finally:
        os.chdir(before)
    return {stage.name: stage for stage in stages}


def check_chain(case: unittest.TestCase, stages: dict) -> None:
    """Every adapter a stage starts from or plays is trained by an earlier stage, and every data folder it reads
    is written by an earlier one."""
    trained, made = set(), set()
    for name, stage in stages.items():
        cfg = stage.config
        if cfg is None or stage.kind == "ship":
            continue
        adapters = {"sft": lambda: cfg.model.adapter, "grpo": lambda: cfg.model.adapter}.get(
            stage.kind, lambda: getattr(cfg, "adapter", None))()
        folders = [cfg.data.folder] if stage.kind == "sft" else [cfg.data] if stage.kind == "cover" else []
        if adapters and not adapters.startswith("adapters/"):          # (the guard plays the shipped one)
            case.assertIn(adapters, trained, f"stage {name} uses {adapters} before any stage trains it")
        for folder in folders:
            case.assertIn(folder, made, f"stage {name} reads {folder} before any stage writes it")
        if stage.kind in ("sft", "grpo"):
            trained.add(str(stage.run_dir / "adapters"))
        if stage.kind in ("data", "self-play", "cover"):
            made.add(str(stage.out))


def leaf_paths(data: dict, prefix: str = "") -> set[str]:
    """The dotted paths of a config dump's settings (a list, such as rl.k_weights, is one setting)."""
    paths: set[str] = set()
    for key, value in data.items():
        paths |= leaf_paths(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
    return paths


def adapters_of(cfg) -> Path:
    """The adapter folder a SFT or GRPO config's run writes."""
    return resolve_path(cfg, cfg.run.logs_dir).resolve() / cfg.run.name / "adapters"


def model_free(text: str) -> str:
    """A config's text without its model names (a copy of a config for another model reads the same)."""
    return re.sub(r"(gemma-?3-?)?\d+(\.\d+)?[mb](-it)?(-(bf16|4bit|8bit))?", "MODEL", text, flags=re.I)


class ShippedConfigTest(unittest.TestCase):
    def test_every_config_validates_with_the_strict_loader(self):
        files = sorted(CONFIG.rglob("*.json"))
        self.assertGreaterEqual(len(files), 4)
        self.assertTrue(DEMO.is_dir(), DEMO)
        self.assertTrue(RECIPE.is_file(), RECIPE)
        for path in files:
            with self.subTest(config=str(path.relative_to(CONFIG))):
                cfg = load_config(path, model_for(path))
                self.assertTrue(resolve_path(cfg, "x").is_relative_to(CONFIG))
                paths = {"out": getattr(cfg, "out", None), "data": getattr(cfg, "data", None)}
                if hasattr(cfg, "run"):
                    paths.update(data=getattr(getattr(cfg, "data", None), "folder", None), logs_dir=cfg.run.logs_dir)
                for field, value in paths.items():     # paths stay inside the checkout
                    if isinstance(value, str):
                        self.assertTrue(resolve_path(cfg, value).resolve().is_relative_to(ROOT), f"{field} = {value}")

    def test_config_holds_what_a_user_edits(self):
        """At most 10 files, the recipe file included; no two that differ only in the model name (the model's
        settings derive from `wordle-mlx recipe --model`)."""
        files = sorted(p for p in CONFIG.rglob("*") if p.is_file())
        self.assertLessEqual(len(files), 10, [str(p.relative_to(CONFIG)) for p in files])
        self.assertIn(RECIPE, files)
        seen = {}
        for path in files:
            key = model_free(path.read_text())
            self.assertNotIn(key, seen, f"{path} is {seen.get(key)} but for the model")
            seen[key] = path
        self.assertEqual(model_free('"mlx-community/gemma-3-4b-it-bf16" builtin:gemma-3-270m'),
                         '"mlx-community/MODEL" builtin:MODEL')

    def test_the_shipped_adapters_recorded_recipe_is_read_or_refused_in_one_line(self):
        """adapters/gemma-3-270m-wordle/recipe/ records the configs that trained it, in the config shape of the
        version that trained each: its data and self-play configs and the later SFT rounds' (sft_10-12) load with
        today's strict loader; the earlier chain's SFT and GRPO configs (sft_1-9, grpo_1-3: the shape before one
        trainer) and grpo_4 (rl.max_loss_tokens_per_microbatch, now an eighth of rl.max_tokens_per_microbatch) are
        refused with the one-line error of an unknown field, naming the file, the field and its value."""
        recipe = ROOT / "adapters" / "gemma-3-270m-wordle" / "recipe"
        if (recipe.parent / "recipe.json").is_file():          # a package `wordle-mlx recipe` shipped
            self.check_recipe_package(recipe.parent)
            return
        kinds = {"data": DataConfig, "sft": SFTConfig, "grpo": GRPOConfig, "choice": ChoiceConfig}
        files = sorted(recipe.glob("*.json"))
        self.assertEqual(len(files), 24)
        for path in files:
            with self.subTest(config=path.name):
                kind, number = path.stem.split("_")
                if int(number) <= {"sft": 9, "grpo": 4}.get(kind, 0):        # an older shape
                    with self.assertRaises(UserError) as ctx:
                        load_config(path, kinds[kind])
                    self.assertRegex(str(ctx.exception), rf"^{re.escape(str(path))}: [\w.]+: (unknown field|Input "
                                     r"should be a valid dictionary)[^\n]* \(got .+\)( \[and \d+ more error\(s\)\])?$")
                else:
                    load_config(path, kinds[kind])
        with self.assertRaisesRegex(UserError, rf"^{re.escape(str(recipe / 'grpo_4.json'))}: "
                                    r"rl\.max_loss_tokens_per_microbatch: unknown field \(got 256\)$"):
            load_config(recipe / "grpo_4.json", GRPOConfig)

    def check_recipe_package(self, package: Path) -> None:
        """A package the recipe's ship stage wrote: its recipe file loads, and each stage's snapshot in `recipe/`
        loads with its stage kind's strict loader; stage_seconds.json names the stages in the order they ran."""
        from wordle_mlx.stages.recipe_build import CONFIG_MODELS
        from wordle_mlx.stages.recipe_file import expand, load_recipe
        from wordle_mlx.stages.recipe_ship import ShipConfig

        steps = {step.name: step.kind for step in expand(load_recipe(package / "recipe.json"), "270m")}
        models = {**CONFIG_MODELS, "ship": ShipConfig}
        files = sorted((package / "recipe").glob("*.json"))
        self.assertIn("ship.json", [p.name for p in files])
        for path in files:
            with self.subTest(config=path.name):
                load_config(path, models[steps[path.stem]])
        seconds = json.loads((package / "stage_seconds.json").read_text())
        self.assertEqual(list(seconds), [name for name in steps if name in seconds])
        self.assertEqual(list(seconds)[0], "model")

    def test_an_unknown_field_is_one_line_naming_file_field_and_value(self):
        """Fields of older shapes get no special message: an unknown field is `file: field.path: unknown field (got
        value)`, counting any further errors, whichever section it is in."""
        with tempfile.TemporaryDirectory() as tmp:
            cases = [(GRPOConfig, {"rl": {"max_loss_tokens_per_microbatch": 128}},
                      "rl.max_loss_tokens_per_microbatch: unknown field (got 128)"),
                     (GRPOConfig, {"training": {"steps": 3}}, 'training: unknown field (got {"steps": 3})'),
                     (SFTConfig, {"learning_rate": 1e-4, "steps": 3},
                      "learning_rate: unknown field (got 0.0001) [and 1 more error(s)]"),
                     (SFTConfig, {"model": {"start_adapter": "a"}}, "model.start_adapter: unknown field (got 'a')"),
                     (DataConfig, {"history": {"solver": 0.4}}, "history.solver: unknown field (got 0.4)")]
            for model, data, message in cases:
                with self.subTest(data=data):
                    path = Path(tmp) / "x.json"
                    path.write_text(json.dumps(data))
                    with self.assertRaises(UserError) as ctx:
                        load_config(path, model)
                    self.assertEqual(str(ctx.exception), f"{path}: {message}")

    def test_print_config_leaf_settings(self):
        """`train --print-config` prints at most 40 leaf settings, and every setting of the shared training shape
        (`TrainConfig`) has the same key path in `sft --print-config`."""
        printed = {}
        for command in ("train", "sft"):
            result = CliRunner().invoke(app, [command, "--print-config"])
            self.assertEqual(result.exit_code, 0, result.output)
            printed[command] = leaf_paths(json.loads(result.stdout))
        self.assertLessEqual(len(printed["train"]), 40, sorted(printed["train"]))
        shared = leaf_paths(TrainConfig().model_dump(mode="json"))
        self.assertLessEqual(shared, printed["train"] & printed["sft"])

    def test_pipeline_paths_chain(self):
        """The demo's GRPO config starts from the adapter its SFT config writes; SFT reads what data writes."""
        sft = load_config(DEMO / "sft.json", SFTConfig)
        data = load_config(DEMO / "data.json", DataConfig)
        self.assertEqual(resolve_path(sft, sft.data.folder).resolve(), resolve_path(data, data.out).resolve())
        grpo = load_config(DEMO / "grpo.json", GRPOConfig)
        self.assertEqual(resolve_path(grpo, grpo.model.adapter).resolve(), adapters_of(sft))


class RecipeChainTest(unittest.TestCase):
    """The 270M chain `wordle-mlx recipe` builds from config/recipe.json (its numbers: tests/test_recipe_runner.py)."""

    def test_each_stage_reads_what_an_earlier_one_writes(self):
        stages = chain_270m()
        check_chain(self, stages)
        adapter = lambda name: str(stages[name].run_dir / "adapters")   # noqa: E731
        # SFT 1 -> focus -> fit, each on the data its own data stage writes
        for sft, start, data in (("sft-focus", "sft", "data-focus"), ("sft-fit", "sft-focus", "data-fit")):
            self.assertEqual(stages[sft].config.model.adapter, adapter(start))
            self.assertEqual(stages[sft].config.data.folder, str(stages[data].out))
        # the self-choice round plays the fit adapter; its SFT passes train on its data, each from the one before
        self.assertEqual(stages["choice"].config.adapter, adapter("sft-fit"))
        for sft, start in (("sft-choice", "sft-fit"), ("sft-choice2", "sft-choice"), ("sft-choice3", "sft-choice2"),
                           ("sft-choice4", "sft-choice3")):
            self.assertEqual(stages[sft].config.model.adapter, adapter(start))
            self.assertEqual(stages[sft].config.data.folder, str(stages["choice"].out))
        # three coverage rounds: self-play from the adapter before, cover on its folder, one SFT pass on that;
        # GRPO after the first from its SFT pass, the second round from GRPO's kept adapter
        for play, cover, sft, start in (("choice2", "cover", "sft-cover", "sft-choice4"),
                                        ("choice3", "cover2", "sft-cover2", "grpo-cover"),
                                        ("choice4", "cover3", "sft-cover3", "sft-cover2")):
            with self.subTest(round=sft):
                self.assertEqual(stages[play].config.adapter, adapter(start))
                self.assertEqual(stages[cover].config.data, str(stages[play].out))
                self.assertEqual(stages[sft].config.data.folder, str(stages[cover].out))
                self.assertEqual(stages[sft].config.model.adapter, adapter(start))
        self.assertEqual(stages["grpo-cover"].config.model.adapter, adapter("sft-cover"))

    def test_the_recipe_trains_words_decoding_and_guards_what_it_ships(self):
        """Self-play, the later SFT passes and GRPO use words decoding; the three coverage SFT passes (and only
        they) train the whole reply (train_free); GRPO runs at least 100 steps, validated from step 0 with the
        best pass kept; the ship stage ships the last pass, guarded in words decoding (at least as many wins),
        free decoding and seeded boards (not significantly worse) against the shipped adapter's evals made before
        it, and packages every eval of the run."""
        stages = chain_270m()
        for name in ("choice", "choice2", "choice3", "choice4"):
            self.assertEqual(stages[name].config.decode, "words", name)
        for name in ("sft", "sft-focus", "sft-fit"):
            self.assertEqual(stages[name].config.decode, "grammar", name)
        for name in ("sft-choice", "sft-choice2", "sft-choice3", "sft-choice4", "sft-cover", "sft-cover2",
                     "sft-cover3"):
            self.assertEqual(stages[name].config.decode, "words", name)
            self.assertEqual(stages[name].config.train_free, name.startswith("sft-cover"), name)
        grpo = stages["grpo-cover"].config
        self.assertEqual(grpo.decode, "words")
        self.assertGreaterEqual(grpo.run.steps, 100)
        self.assertEqual(grpo.validation.games, 100)
        self.assertGreater(grpo.validation.every, 0)                   # step 0, every 20 steps, the best kept
        self.assertEqual(grpo.run.steps % grpo.validation.every, 0)
        names = list(stages)
        ship = stages["ship"].config
        self.assertEqual(ship.adapter, str(stages["sft-cover3"].run_dir / "adapters"))
        for pair in ship.guard:
            shipped = {s.config.out: n for n, s in stages.items() if s.kind == "eval"}[pair.shipped]
            self.assertLess(names.index(shipped), names.index("ship"))
            self.assertEqual(stages[shipped].config.adapter, ship.out)
        self.assertEqual([(g.setting, g.primary) for g in ship.guard], [("words", True), ("free", False),
                                                                          ("seeded", False)])
        self.assertEqual(sorted(ship.evals), sorted(str(s.out) for s in stages.values() if s.kind == "eval"))


if __name__ == "__main__":
    unittest.main()

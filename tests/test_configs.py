"""Every shipped config in config/ validates against its stage's model, and its paths resolve sensibly; an old or
misspelt field is a one-line error; `train --print-config` stays within 40 settings."""

from __future__ import annotations

import json
import os
import re
import subprocess
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
from wordle_mlx.stages.sft import SFTConfig
from wordle_mlx.stages.train_config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"
RECIPE = CONFIG / "recipe-270m"
DEMO = CONFIG / "demo"
# a config's stage, from the start of its file name (config/<purpose>/<stage>[-variant].json)
MODELS = {"data": DataConfig, "sft": SFTConfig, "grpo": GRPOConfig, "eval": EvalConfig, "self-play": ChoiceConfig}


def model_for(path: Path):
    for prefix, model in MODELS.items():
        if path.stem.startswith(prefix):
            return model
    raise AssertionError(f"{path}: no stage model known for this name (expected one of {', '.join(MODELS)}...)")


def dry_run(script: str, **env) -> list[tuple[str, str]]:
    """(stage, command) for every stage `scripts/<script>` would run from scratch (DRY_RUN=1, a fresh marker
    folder), in order; the script must exit 0."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["bash", str(ROOT / "scripts" / script)], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "DRY_RUN": "1", "R": tmp, **env})
    if out.returncode != 0:
        raise AssertionError(f"{script} exited {out.returncode}: {out.stderr.strip()}")
    return re.findall(r"^== ([\w-]+): (.*)$", out.stdout, flags=re.M)


def check_stage_chain(case: unittest.TestCase, stages: list[tuple[str, str]]) -> None:
    """Every --config file exists, and every adapter a stage starts from or plays is written by an earlier one."""
    trained: set[str] = set()
    for name, command in stages:
        for config in re.findall(r"--config (\S+)", command):
            case.assertTrue((ROOT / config).is_file(), f"stage {name}: no {config}")
        for run in re.findall(r"--(?:start-)?adapter logs/([\w-]+)/adapters", command):
            case.assertIn(run, trained, f"stage {name} uses logs/{run}/adapters before any stage trains it")
        trained.update(re.findall(r"^train_or_resume logs/([\w-]+) ", command))


def leaf_paths(data: dict, prefix: str = "") -> set[str]:
    """The dotted paths of a config dump's settings (a list, such as rl.k_weights, is one setting)."""
    paths: set[str] = set()
    for key, value in data.items():
        paths |= leaf_paths(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
    return paths


def adapters_of(cfg) -> Path:
    """The adapter folder a SFT or GRPO config's run writes."""
    return resolve_path(cfg, cfg.run.logs_dir).resolve() / cfg.run.name / "adapters"


class ShippedConfigTest(unittest.TestCase):
    def test_every_config_validates_with_the_strict_loader(self):
        files = sorted(CONFIG.rglob("*.json"))
        self.assertGreaterEqual(len(files), 18)
        for folder in (DEMO, RECIPE):
            self.assertTrue(folder.is_dir(), folder)
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

    def test_the_shipped_adapters_recorded_recipe_is_read_or_refused_in_one_line(self):
        """adapters/gemma-3-270m-wordle/recipe/ records the configs that trained it, in the config shape of the
        version that trained each: its data and self-play configs and the later SFT rounds' (sft_10-12) load with
        today's strict loader; the earlier chain's SFT and GRPO configs (sft_1-9, grpo_1-3: the shape before one
        trainer) and grpo_4 (rl.max_loss_tokens_per_microbatch, now an eighth of rl.max_tokens_per_microbatch) are
        refused with the one-line error of an unknown field, naming the file, the field and its value."""
        recipe = ROOT / "adapters" / "gemma-3-270m-wordle" / "recipe"
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
        """Each GRPO config starts from the adapter its SFT config writes; SFT reads what data writes."""
        chains = [(RECIPE / "sft-cover", RECIPE / "grpo-cover", None),
                  (DEMO / "sft", DEMO / "grpo", DEMO / "data")]
        for sft_name, grpo_name, data_name in chains:
            with self.subTest(sft=sft_name.name):
                sft = load_config(sft_name.with_suffix(".json"), SFTConfig)
                if data_name is not None:          # the choice stage's data: test_choice_round_chains
                    data = load_config(data_name.with_suffix(".json"), DataConfig)
                    self.assertEqual(resolve_path(sft, sft.data.folder).resolve(),
                                     resolve_path(data, data.out).resolve())
                grpo = load_config(grpo_name.with_suffix(".json"), GRPOConfig)
                self.assertEqual(resolve_path(grpo, grpo.model.adapter).resolve(), adapters_of(sft))
        # each later SFT stage starts from the adapter the one before it writes: SFT 1 -> focus -> fit, on the
        # data its own data config writes
        stages = [(load_config(RECIPE / f"{name}.json", SFTConfig), load_config(RECIPE / f"{data}.json", DataConfig))
                  for name, data in (("sft", "data"), ("sft-focus", "data-focus"), ("sft-fit", "data-fit"))]
        for (earlier, _), (later, data) in zip(stages, stages[1:]):
            with self.subTest(sft=later.run.name):
                self.assertEqual(resolve_path(later, later.model.adapter).resolve(), adapters_of(earlier))
                self.assertEqual(resolve_path(later, later.data.folder).resolve(), resolve_path(data, data.out).resolve())

    def test_the_recipe_script_runs_every_stage_in_order(self):
        """The whole script under DRY_RUN=1: it reaches the end (a shell error in a stage loop would stop a real
        run between two stages), each stage's config exists and each adapter comes from an earlier stage."""
        stages = dry_run("train_270m_cpu.sh")
        training = ["setup", "model", "entropy", "data", "sft", "data-focus", "sft-focus", "data-fit", "sft-fit",
                    "choice", "sft-choice", "sft-choice2", "sft-choice3", "sft-choice4", "choice2", "cover",
                    "sft-cover", "grpo-cover", "choice3", "cover2", "sft-cover2", "choice4", "cover3", "sft-cover3"]
        names = [name for name, _ in stages]
        self.assertEqual(names[:len(training)], training)
        self.assertEqual(names[-2:], ["plots", "ship"])
        self.assertIn("eval-grpocover-greedy", names)
        self.assertIn("eval-sftcover3-greedy", names)
        check_stage_chain(self, stages)

    def test_the_recipe_trains_words_decoding_and_guards_what_it_ships(self):
        """Self-play, the later SFT passes and GRPO use words decoding; the three coverage SFT passes (and only
        they) train the whole reply (train_free); GRPO runs at least 100 steps with validation from step 0 and keeps the best pass; the ship stage gets
        the guard (the last pass's greedy test eval against the shipped adapter's, in words decoding, made before
        it) and ships GRPO's evals and its SFT start's beside the last pass's."""
        for name in ("self-play", "self-play-2", "self-play-3", "self-play-4"):
            self.assertEqual(load_config(RECIPE / f"{name}.json", ChoiceConfig).decode, "words", name)
        for name in ("sft", "sft-focus", "sft-fit"):
            self.assertEqual(load_config(RECIPE / f"{name}.json", SFTConfig).decode, "grammar", name)
        for name in ("sft-choice", "sft-choice-more", "sft-cover", "sft-cover-2", "sft-cover-3"):
            sft = load_config(RECIPE / f"{name}.json", SFTConfig)
            self.assertEqual(sft.decode, "words", name)
            self.assertEqual(sft.train_free, name.startswith("sft-cover"), name)   # the coverage passes
        grpo = load_config(RECIPE / "grpo-cover.json", GRPOConfig)
        self.assertEqual(grpo.decode, "words")
        self.assertGreaterEqual(grpo.run.steps, 100)
        self.assertEqual(grpo.validation.games, 100)
        self.assertEqual(grpo.run.steps % grpo.validation.every, 0)
        stages = dict(dry_run("train_270m_cpu.sh"))
        names = list(stages)
        self.assertLess(names.index("eval-shipped-words"), names.index("ship"))
        self.assertIn("--decode words --out", stages["eval-shipped-words"])
        self.assertRegex(stages["ship"], r"--guard \S+/eval_sftcover3_greedy.json \S+/eval_shipped_greedy_words.json")
        self.assertIn("--stage-seconds", stages["ship"])
        self.assertIn("--adapter logs/sft-cover3-270m/adapters ", stages["ship"])
        for evals in ("eval_sftcover3_*.json", "eval_grpocover_*.json", "eval_sftcover_*.json"):
            self.assertIn(evals, stages["ship"])
        self.assertIn("eval-sftcover3-free", names)

    def test_choice_round_chains(self):
        """The self-choice round labels boards with the fit adapter's choices, and its SFT stages train on that
        data, the first from the same adapter and each later pass from the one before: sft-fit -> self-play ->
        sft-choice -> sft-choice2 (sft-choice-more.json) -> the script's passes 3 and 4 (the same file with
        flags)."""
        fit = load_config(RECIPE / "sft-fit.json", SFTConfig)
        choice = load_config(RECIPE / "self-play.json", ChoiceConfig)
        self.assertEqual(resolve_path(choice, choice.adapter).resolve(), adapters_of(fit))
        adapter = adapters_of(fit)
        for name in ("sft-choice", "sft-choice-more"):
            with self.subTest(sft=name):
                sft = load_config(RECIPE / f"{name}.json", SFTConfig)
                self.assertEqual(resolve_path(sft, sft.model.adapter).resolve(), adapter)
                self.assertEqual(resolve_path(sft, sft.data.folder).resolve(), resolve_path(choice, choice.out).resolve())
                adapter = adapters_of(sft)
        self.assertEqual(adapter.parent.name, "sft-choice2-270m")
        script = (ROOT / "scripts" / "train_270m_cpu.sh").read_text()
        self.assertIn("for n in 2 3 4; do", script)
        self.assertIn("--run-name sft-choice$n-270m --adapter logs/$prev/adapters", script)
        self.assertIn("sft --config config/recipe-270m/sft-choice-more.json", script)

    def test_coverage_round_chains(self):
        """The coverage round: the second choice round plays the last self-choice pass's adapter, the script's
        `cover` line reads its folder and writes the one the SFT stage trains on, from the same adapter:
        sft-choice4 -> choice2 -> cover -> sft-cover (-> grpo-cover, checked above)."""
        more = load_config(RECIPE / "sft-choice-more.json", SFTConfig)
        adapter = resolve_path(more, more.run.logs_dir).resolve() / "sft-choice4-270m" / "adapters"
        choice = load_config(RECIPE / "self-play-2.json", ChoiceConfig)
        self.assertEqual(resolve_path(choice, choice.adapter).resolve(), adapter)
        script = (ROOT / "scripts" / "train_270m_cpu.sh").read_text()
        match = re.search(r"\$W data cover --data (\S+) --out (\S+)", script)
        self.assertIsNotNone(match, "scripts/train_270m_cpu.sh: no `$W data cover --data A --out B` line")
        self.assertEqual((ROOT / match[1]).resolve(), resolve_path(choice, choice.out).resolve())
        sft = load_config(RECIPE / "sft-cover.json", SFTConfig)
        self.assertEqual(resolve_path(sft, sft.data.folder).resolve(), (ROOT / match[2]).resolve())
        self.assertEqual(resolve_path(sft, sft.model.adapter).resolve(), adapter)

    def test_later_coverage_round_chains(self):
        """Two more coverage rounds after GRPO, each from the adapter before: grpo-cover -> choice3 -> cover2 ->
        sft-cover2 -> choice4 -> cover3 -> sft-cover3; the script's cover lines read each round's self-play folder
        and write the folder its SFT pass trains on."""
        stages = dict(dry_run("train_270m_cpu.sh"))
        covers = {name: re.search(r"data cover --data (\S+) --out (\S+)", stages[name]).groups()
                  for name in ("cover2", "cover3")}
        adapter = adapters_of(load_config(RECIPE / "grpo-cover.json", GRPOConfig))
        for play_name, sft_name, (cover_in, cover_out) in (("self-play-3", "sft-cover-2", covers["cover2"]),
                                                          ("self-play-4", "sft-cover-3", covers["cover3"])):
            with self.subTest(sft=sft_name):
                play = load_config(RECIPE / f"{play_name}.json", ChoiceConfig)
                sft = load_config(RECIPE / f"{sft_name}.json", SFTConfig)
                self.assertEqual(resolve_path(play, play.adapter).resolve(), adapter)
                self.assertEqual(resolve_path(sft, sft.model.adapter).resolve(), adapter)
                self.assertEqual((ROOT / cover_in).resolve(), resolve_path(play, play.out).resolve())
                self.assertEqual(resolve_path(sft, sft.data.folder).resolve(), (ROOT / cover_out).resolve())
                adapter = adapters_of(sft)
        self.assertEqual(adapter.parent.name, "sft-cover3-270m")


if __name__ == "__main__":
    unittest.main()

"""Every shipped config in config/ validates against its stage's model, and its paths resolve sensibly."""

from __future__ import annotations

import re
import unittest
from pathlib import Path

from wordle_mlx.config import load_config, resolve_path
from wordle_mlx.stages.choice import ChoiceConfig
from wordle_mlx.stages.dagger import DaggerConfig
from wordle_mlx.stages.data import DataConfig
from wordle_mlx.stages.evaluate import EvalConfig
from wordle_mlx.stages.grpo import GRPOConfig
from wordle_mlx.stages.sft import SFTConfig

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"
MODELS = {"data": DataConfig, "demo_data": DataConfig, "sft": SFTConfig, "demo_sft": SFTConfig,
          "grpo": GRPOConfig, "demo_grpo": GRPOConfig, "eval": EvalConfig, "dagger": DaggerConfig,
          "choice": ChoiceConfig}


def model_for(path: Path):
    stem = path.stem
    for prefix in ("demo_data", "demo_sft", "demo_grpo", "data", "sft", "grpo", "eval", "dagger", "choice"):
        if stem.startswith(prefix):
            return MODELS[prefix]
    raise AssertionError(f"no stage model known for {path.name}")


class ShippedConfigTest(unittest.TestCase):
    def test_every_config_validates(self):
        files = sorted(CONFIG.glob("*.json"))
        self.assertGreaterEqual(len(files), 8)
        for path in files:
            with self.subTest(config=path.name):
                cfg = load_config(path, model_for(path))
                self.assertTrue(resolve_path(cfg, "x").is_relative_to(CONFIG))

    def test_pipeline_paths_chain(self):
        """Each GRPO config starts from the adapter its SFT config writes; SFT reads what data writes."""
        chains = [("sft_cpu_270m", "grpo_cpu_270m", "data"), ("sft_focus_cpu_270m", "grpo_focus_cpu_270m", "data_focus"),
                  ("sft_fit_cpu_270m", "grpo_fit_cpu_270m", "data_fit"),
                  ("sft_choice5_cpu_270m", "grpo_choice_cpu_270m", None),
                  ("sft_cover_cpu_270m", "grpo_cover_cpu_270m", None),
                  ("demo_sft", "demo_grpo", "demo_data")]
        for sft_name, grpo_name, data_name in chains:
            with self.subTest(sft=sft_name):
                sft = load_config(CONFIG / f"{sft_name}.json", SFTConfig)
                if data_name is not None:          # the choice stage's data: test_choice_round_chains
                    data = load_config(CONFIG / f"{data_name}.json", DataConfig)
                    self.assertEqual(resolve_path(sft, sft.data).resolve(), resolve_path(data, data.out).resolve())
                grpo = load_config(CONFIG / f"{grpo_name}.json", GRPOConfig)
                sft_adapters = resolve_path(sft, sft.logs_dir).resolve() / sft.run_name / "adapters"
                self.assertEqual(resolve_path(grpo, grpo.model.adapter).resolve(), sft_adapters)
        # each later SFT stage starts from the adapter the one before it writes: SFT 1 -> focus -> fit
        stages = [load_config(CONFIG / f"{name}.json", SFTConfig)
                  for name in ("sft_cpu_270m", "sft_focus_cpu_270m", "sft_fit_cpu_270m")]
        for earlier, later in zip(stages, stages[1:]):
            with self.subTest(sft=later.run_name):
                self.assertEqual(resolve_path(later, later.init_adapter).resolve(),
                                 resolve_path(earlier, earlier.logs_dir).resolve() / earlier.run_name / "adapters")

    def test_dagger_rounds_chain(self):
        """Each DAgger round plays the adapter the stage before it wrote, adds to the data before it, and its
        SFT stage trains on that data from the same adapter: grpo-fit -> dagger -> sft-dagger -> dagger2 ->
        sft-dagger2."""
        grpo = load_config(CONFIG / "grpo_fit_cpu_270m.json", GRPOConfig)
        adapter = resolve_path(grpo, grpo.logs_dir).resolve() / grpo.run_name / "adapters"
        data_fit = load_config(CONFIG / "data_fit.json", DataConfig)
        base = resolve_path(data_fit, data_fit.out).resolve()
        for dagger_name, sft_name in (("dagger_270m", "sft_dagger_cpu_270m"), ("dagger2_270m", "sft_dagger2_cpu_270m")):
            with self.subTest(dagger=dagger_name):
                dagger = load_config(CONFIG / f"{dagger_name}.json", DaggerConfig)
                sft = load_config(CONFIG / f"{sft_name}.json", SFTConfig)
                self.assertEqual(resolve_path(dagger, dagger.adapter).resolve(), adapter)
                self.assertEqual(resolve_path(dagger, dagger.base_data).resolve(), base)
                self.assertEqual(resolve_path(sft, sft.init_adapter).resolve(), adapter)
                self.assertEqual(resolve_path(sft, sft.data).resolve(), resolve_path(dagger, dagger.out).resolve())
                adapter = resolve_path(sft, sft.logs_dir).resolve() / sft.run_name / "adapters"
                base = resolve_path(dagger, dagger.out).resolve()

    def test_choice_round_chains(self):
        """The self-choice round labels boards with the GRPO-fit adapter's choices, and its SFT stages train on
        that data, the first from the same adapter and each later one from the one before:
        grpo-fit -> choice -> sft-choice -> sft-choice2 -> ... -> sft-choice5 (-> grpo-choice, checked above)."""
        grpo = load_config(CONFIG / "grpo_fit_cpu_270m.json", GRPOConfig)
        adapter = resolve_path(grpo, grpo.logs_dir).resolve() / grpo.run_name / "adapters"
        choice = load_config(CONFIG / "choice_270m.json", ChoiceConfig)
        self.assertEqual(resolve_path(choice, choice.adapter).resolve(), adapter)
        for name in ("sft_choice_cpu_270m", *(f"sft_choice{n}_cpu_270m" for n in range(2, 6))):
            with self.subTest(sft=name):
                sft = load_config(CONFIG / f"{name}.json", SFTConfig)
                self.assertEqual(resolve_path(sft, sft.init_adapter).resolve(), adapter)
                self.assertEqual(resolve_path(sft, sft.data).resolve(), resolve_path(choice, choice.out).resolve())
                adapter = resolve_path(sft, sft.logs_dir).resolve() / sft.run_name / "adapters"

    def test_coverage_round_chains(self):
        """Part 3 of the recipe: the second choice round plays the GRPO-choice adapter, the script's `cover` line
        reads its folder and writes the one the SFT stage trains on, from the same adapter:
        grpo-choice -> choice2 -> cover -> sft-cover (-> grpo-cover, checked above)."""
        grpo = load_config(CONFIG / "grpo_choice_cpu_270m.json", GRPOConfig)
        adapter = resolve_path(grpo, grpo.logs_dir).resolve() / grpo.run_name / "adapters"
        choice = load_config(CONFIG / "choice2_270m.json", ChoiceConfig)
        self.assertEqual(resolve_path(choice, choice.adapter).resolve(), adapter)
        script = (ROOT / "scripts" / "train_270m_cpu.sh").read_text()
        match = re.search(r"\$W cover --data (\S+) --out (\S+)", script)
        self.assertIsNotNone(match, "scripts/train_270m_cpu.sh: no `$W cover --data A --out B` line")
        self.assertEqual((ROOT / match[1]).resolve(), resolve_path(choice, choice.out).resolve())
        sft = load_config(CONFIG / "sft_cover_cpu_270m.json", SFTConfig)
        self.assertEqual(resolve_path(sft, sft.data).resolve(), (ROOT / match[2]).resolve())
        self.assertEqual(resolve_path(sft, sft.init_adapter).resolve(), adapter)


if __name__ == "__main__":
    unittest.main()

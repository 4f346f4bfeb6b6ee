"""The adapter shipped in adapters/gemma-3-270m-wordle/: honest data, the right format, reproducible evals.

- No test word is a secret in the shipped data seed, and the seed really is the data the adapter saw
  (the shipped data config regenerates the same secrets).
- The adapter is an mlx-lm adapter under 20 MB, with its recipe configs.
- Greedy play is deterministic: replaying the first test words reproduces the shipped eval's games.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from wordle_mlx.config import load_config
from wordle_mlx.game.splits import split_answers
from wordle_mlx.stages import choice, data
from wordle_mlx.stages.pattern_table import load_table

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "adapters" / "gemma-3-270m-wordle"


def shipped_eval() -> dict:
    """The shipped adapter's greedy empty-board test eval in the decoding it records (grammar without a record):
    of the package's eval JSONs, the one made with the adapter it was packaged from (its README names it; the
    package also holds evals of the stages before it)."""
    recorded = json.loads((SHIPPED / "adapter_config.json").read_text()).get("decode", "grammar")
    source = re.search(r"packaged from `([^`]+)`", (SHIPPED / "README.md").read_text())
    if source is None:
        raise AssertionError(f"{SHIPPED / 'README.md'}: does not say which adapter it was packaged from")
    evals = [json.loads(p.read_text()) for p in sorted(SHIPPED.glob("eval_*.json"))]
    greedy = [e for e in evals if e["temperature"] == 0 and e["history"] == "none" and e["split"] == "test"
              and e.get("decode", "free") == recorded and not e.get("constrain") and e["adapter"] == source[1]]
    if len(greedy) != 1:
        raise AssertionError(f"{SHIPPED}: {len(greedy)} greedy empty-board test eval JSONs of {source[1]} in "
                             f"{recorded} decoding shipped, expected 1")
    return greedy[0]


def self_play_rounds() -> list[Path]:
    """The self-play rounds' configs the package records: its recipe's self-play stages (`recipe.json` and the
    stage snapshots in `recipe/`, as `wordle-mlx recipe` ships), or `recipe/choice_N.json` (the shell recipe's)."""
    if (SHIPPED / "recipe.json").is_file():
        from wordle_mlx.stages.recipe_file import expand, load_recipe
        steps = expand(load_recipe(SHIPPED / "recipe.json"), "270m")
        return [SHIPPED / "recipe" / f"{step.name}.json" for step in steps if step.kind == "self-play"]
    return sorted((SHIPPED / "recipe").glob("choice_*.json"))


class ShippedDataSeedTest(unittest.TestCase):
    def setUp(self):
        self.seed = json.loads((SHIPPED / "data_seed.json").read_text())

    def test_no_test_word_is_a_training_or_validation_secret(self):
        test = set(split_answers()["test"])
        self.assertEqual(len(test), 200)
        for split in ("train", "valid"):
            secrets = set(self.seed["secrets"][split])
            self.assertGreater(len(secrets), 50)
            self.assertEqual(secrets & test, set(), split)
            self.assertTrue(secrets <= set(split_answers()[split]), split)

    def test_seed_regenerates_the_shipped_secrets(self):
        solver = data.Solver(load_table(show_progress=False))
        splits = split_answers(solver.table.answers)
        self.assertGreaterEqual(len(self.seed["data_configs"]), 1)
        for i, cfg_dict in enumerate(self.seed["data_configs"]):
            # the seeded part only: empty-board games (empty_board_copies) use every secret of the split,
            # which the split check above already covers
            cfg_dict = dict(cfg_dict, progress=False, empty_board_copies=0)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "data.json"
                path.write_text(json.dumps(cfg_dict))
                cfg = load_config(path, data.DataConfig)
            for split in ("train", "valid"):
                records = data.make_split(split, 60, cfg, solver, splits)
                regenerated = {r["meta"]["secret"] for r in records}
                self.assertTrue(regenerated <= set(self.seed["secrets"][split]), (i, split))

    def test_on_policy_rounds_played_only_shipped_secrets(self):
        """Each self-play round's secrets (a seeded shuffle of the split) are in the shipped seed, so the split
        check above covers them; a recipe with choice_N.json files must list their configs."""
        splits = split_answers()
        rounds = self_play_rounds()
        self.assertEqual(len(self.seed.get("choice_configs", [])), len(rounds))
        for cfg_dict in self.seed.get("choice_configs", []):
            cfg = choice.ChoiceConfig(**cfg_dict)  # its defaults for what the file leaves out
            for split, played in choice.played_secrets(cfg, splits).items():
                self.assertTrue(set(played) <= set(self.seed["secrets"][split]), split)


class ShippedAdapterTest(unittest.TestCase):
    def test_adapter_files(self):
        size = (SHIPPED / "adapters.safetensors").stat().st_size
        self.assertLess(size, 20 * 1024 * 1024)
        config = json.loads((SHIPPED / "adapter_config.json").read_text())
        self.assertEqual(config["fine_tune_type"], "lora")
        self.assertIn("rank", config["lora_parameters"])
        recipe = {p.name for p in (SHIPPED / "recipe").iterdir()}
        self.assertTrue(recipe & {"data.json", "data_1.json"} and recipe & {"sft.json", "sft_1.json"}, recipe)

    def test_greedy_eval_replays_exactly(self):
        published = shipped_eval()
        games = 4
        out = subprocess.run(
            [sys.executable, "-m", "wordle_mlx", "eval", "--adapter", str(SHIPPED), "--games", str(games),
             "--max-tokens", str(published["max_tokens_per_turn"]), "--decode", published.get("decode", "free"),
             "--no-baselines", "--no-progress", "--json", "--dtype", "float32"],   # the games were played in float32
            capture_output=True, text=True, cwd=ROOT, timeout=900)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        replay = json.loads(out.stdout)
        self.assertEqual(replay["game_records"], published["game_records"][:games])


if __name__ == "__main__":
    unittest.main()

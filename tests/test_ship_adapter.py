"""The recipe's ship stage (wordle_mlx/stages/recipe_ship.py, recipe_guard.py; scripts/ship_adapter.py runs it):
McNemar's exact test against hand-computed values; the guard's pairing of two evals game by game and its
ship / keep decisions; the package (the adapter, the recipe file, every stage's config snapshot, stage seconds in
the order the stages ran, the run's evals, the data seed); its refusals, which leave no folder behind; and a tiny
recipe run end to end through its ship stage, first with nothing shipped, then with the guard comparing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from wordle_mlx.errors import UserError
from wordle_mlx.game.splits import split_answers
from wordle_mlx.stages.choice import secrets_for
from wordle_mlx.stages.recipe_guard import Comparison, NotComparable, compare, mcnemar_p, verdict
from wordle_mlx.stages.recipe_ship import ShipConfig, ship, write_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ship_adapter.py"
SECRETS = ["cigar", "rebut", "sissy", "humph", "awake", "blush", "focal", "evade"]


def write_json(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def eval_json(path: Path, won: list[bool], decode: str = "words", history: str = "none", **extra) -> Path:
    """An eval JSON as `wordle-mlx eval` writes it, with one game per entry of `won` (seeded boards: the first
    guess of each game is its seeded board)."""
    seeded = 1 if history == "seeded" else 0
    records = [{"secret": s, "won": w, "guesses": (["crane"] if seeded else []) + [s], "seeded": seeded}
               for s, w in zip(SECRETS, won)]
    wins = sum(won)
    return write_json(path, {"split": "test", "history": history, "temperature": 0.0, "decode": decode,
                             "wins": wins, "games": len(won), "win_rate": wins / len(won), "win_rate_ci95": [0, 1],
                             "format_error_rate": 0.0, "invalid_rate": 0.0, "max_tokens_per_turn": 16,
                             "game_records": records, **extra})


class McNemarTest(unittest.TestCase):
    def test_hand_computed_values(self):
        """p = min(1, 2 * sum_{i <= min(b, c)} C(b + c, i) / 2^(b + c))."""
        self.assertEqual(mcnemar_p(0, 5), 2 / 32)              # 0.0625: 5 to 0 is not significant
        self.assertEqual(mcnemar_p(0, 6), 2 / 64)              # 0.03125: 6 to 0 is
        self.assertEqual(mcnemar_p(8, 1), 2 * (1 + 9) / 512)   # 0.039
        self.assertEqual(mcnemar_p(2, 2), 1.0)                 # 2 * 11/16 capped at 1
        self.assertEqual(mcnemar_p(0, 0), 1.0)                 # no discordant game
        self.assertEqual(mcnemar_p(3, 7), mcnemar_p(7, 3))
        # the numbers: 32 / 27 discordant games in words decoding, 22 / 34 in free decoding
        self.assertAlmostEqual(mcnemar_p(32, 27), 0.60, places=2)
        self.assertAlmostEqual(mcnemar_p(22, 34), 0.14, places=2)


class GuardRuleTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.root = Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def test_pairs_games_by_secret_and_board(self):
        new = eval_json(self.root / "new.json", [True, True, False, False, True, True])
        old = eval_json(self.root / "old.json", [True, False, True, False, False, False])
        data = json.loads(old.read_text())
        data["game_records"].reverse()                      # another order: still the same games
        write_json(old, data)
        c = compare("words", True, new, old)
        self.assertEqual((c.games, c.new_wins, c.shipped_wins, c.new_only, c.shipped_only), (6, 4, 2, 3, 1))
        self.assertEqual(c.p, mcnemar_p(3, 1))
        self.assertEqual(c.line(), "guard words: new 4 / 6, shipped 2 / 6; won by new only 3, by shipped only 1; "
                                   "McNemar p 0.625 -> ok (at least as many wins)")

    def test_refuses_evals_of_other_games(self):
        new = eval_json(self.root / "new.json", [True, False, True])
        cases = [(eval_json(self.root / "a.json", [True, False, True, True]), "played different games"),
                 (eval_json(self.root / "b.json", [True, False, True], decode="free"), "compares the same decoding"),
                 (eval_json(self.root / "c.json", [True, False, True], temperature=0.7), "temperature is 0.7"),
                 (self.root / "missing.json", "missing")]
        for old, message in cases:
            with self.subTest(message=message), self.assertRaises(NotComparable) as ctx:
                compare("words", True, new, old)
            self.assertIn(message, str(ctx.exception))
        seeded = eval_json(self.root / "s.json", [True, False, True], history="seeded")
        with self.assertRaisesRegex(NotComparable, "history is 'none'"):
            compare("seeded", False, new, seeded)               # the seeded setting compares seeded boards
        other_board = json.loads(seeded.read_text())
        other_board["game_records"][0]["guesses"][0] = "slate"
        with self.assertRaisesRegex(NotComparable, "played different games"):
            compare("seeded", False, seeded, write_json(self.root / "s2.json", other_board))

    def decide(self, *settings: tuple[str, bool, int, int, int, int]) -> str | None:
        """verdict() of comparisons given as (setting, primary, new wins, shipped wins, b, c) of 200 games."""
        return verdict([Comparison(s, p, 200, n, o, b, c) for s, p, n, o, b, c in settings])

    def test_ship_and_keep_decisions(self):
        # the case: more wins in words decoding (129 / 124), fewer but not significantly in free (84 / 96)
        self.assertIsNone(self.decide(("words", True, 129, 124, 32, 27), ("free", False, 84, 96, 22, 34)))
        # level in words decoding ships (at least as many)
        self.assertIsNone(self.decide(("words", True, 124, 124, 10, 10)))
        # one fewer win in words decoding keeps the shipped adapter, however small the gap
        self.assertIn("fewer wins (123 against 124) in the guard's words setting",
                      self.decide(("words", True, 123, 124, 0, 1)))
        # significantly fewer on seeded boards keeps it: 6 games lost that the shipped one won, none the other way
        why = self.decide(("words", True, 130, 124, 6, 0), ("seeded", False, 57, 63, 0, 6))
        self.assertIn("significantly fewer wins (57 against 63, McNemar p 0.0312) in the guard's seeded setting", why)
        # 5 to 0 is not significant (p 0.0625): ships
        self.assertIsNone(self.decide(("words", True, 130, 124, 6, 0), ("seeded", False, 58, 63, 0, 5)))
        # significantly better in a secondary setting is fine, and so is p < 0.05 with more wins
        self.assertIsNone(self.decide(("words", True, 124, 124, 0, 0), ("free", False, 110, 96, 14, 0)))


class PackageTest(unittest.TestCase):
    """ship() on a run folder laid out as the recipe leaves it."""

    STAGES = {"model": "model", "data": "data", "sft": "sft", "choice": "self-play", "eval-sft-greedy": "eval",
              "eval-shipped-words": "eval"}
    SECONDS = {"model": 3, "data": 41, "sft": 783, "choice": 200, "eval-sft-greedy": 95, "eval-shipped-words": 90}

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.root = root = Path(self._tmp.name)
        self.adapter = root / "logs" / "sft-x" / "adapters"
        write_json(self.adapter / "adapter_config.json", {"fine_tune_type": "lora"})
        (self.adapter / "adapters.safetensors").write_bytes(b"\1" * 64)
        self.markers = root / "logs" / "recipe-x"
        for name, seconds in self.SECONDS.items():           # written out of order: the package keeps the run's
            (self.markers / f"{name}.done").parent.mkdir(parents=True, exist_ok=True)
        for name in reversed(self.SECONDS):
            (self.markers / f"{name}.done").write_text(f"{self.SECONDS[name]}\n")
        configs = self.markers / "configs"
        write_json(configs / "data.json", {"out": "../../../data/sft", "seed": 3})
        write_json(configs / "sft.json", {"run": {"steps": 1}})
        write_json(configs / "choice.json", {"out": "../../../data/gone", "seed": 7, "train_games": 5,
                                             "valid_games": 3})
        write_json(configs / "eval-sft-greedy.json", {"games": 6})
        write_json(configs / "eval-shipped-words.json", {"games": 6})
        for split, secrets in (("train", ["cigar", "rebut", "cigar"]), ("valid", ["sissy"])):
            path = root / "data" / "sft" / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps({"messages": [], "meta": {"secret": s}}) + "\n" for s in secrets))
        self.recipe = write_json(root / "recipe.json", {"stages": [{"stage": "data", "kind": "data"}]})
        self.new = eval_json(self.markers / "eval_sft_greedy.json", [True, True, False, True, False, False])
        self.shipped = eval_json(self.markers / "eval_shipped_greedy_words.json",
                                 [True, False, False, True, False, False])
        self.out = root / "adapters" / "x-wordle"
        self.cfg = ShipConfig(model="builtin:x", adapter=str(self.adapter), out=str(self.out), recipe=str(self.recipe),
                              markers=str(self.markers), stages=self.STAGES,
                              evals=[str(self.new), str(self.shipped)],
                              guard=[{"setting": "words", "primary": True, "new": str(self.new),
                                      "shipped": str(self.shipped)}])
        self.path = self.markers / "configs" / "ship.json"
        write_config(self.cfg, self.path)

    def tearDown(self):
        self._tmp.cleanup()

    def run_script(self) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), "--config", str(self.path)], capture_output=True,
                              text=True, cwd=self.root, timeout=300)

    def ship_old(self) -> None:
        write_json(self.out / "adapter_config.json", {"fine_tune_type": "lora"})
        (self.out / "adapters.safetensors").write_bytes(b"\0" * 64)
        (self.out / "old.txt").write_text("the shipped package")

    def test_the_package_holds_what_the_recipe_made(self):
        self.ship_old()
        proc = self.run_script()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("guard words: new 3 / 6, shipped 2 / 6; won by new only 1, by shipped only 0; McNemar p 1 -> ok",
                      proc.stdout)
        self.assertIn("shipped logs/sft-x/adapters -> adapters/x-wordle", proc.stdout)
        out = self.out
        self.assertEqual((out / "adapters.safetensors").read_bytes(), b"\1" * 64)
        self.assertFalse((out / "old.txt").exists())
        self.assertEqual(json.loads((out / "recipe.json").read_text()), json.loads(self.recipe.read_text()))
        self.assertEqual({p.name for p in (out / "recipe").iterdir()},
                         {"choice.json", "data.json", "eval-sft-greedy.json", "eval-shipped-words.json", "ship.json",
                          "sft.json"})
        self.assertEqual((out / "recipe" / "sft.json").read_text(), (self.markers / "configs" / "sft.json").read_text())
        seconds = json.loads((out / "stage_seconds.json").read_text())
        self.assertEqual(list(seconds.items()), list(self.SECONDS.items()))     # the order the stages ran
        self.assertEqual(list(seconds)[0], "model")                             # from the base model on
        for name in ("eval_sft_greedy.json", "eval_shipped_greedy_words.json"):
            self.assertEqual((out / name).read_text(), (self.markers / name).read_text())
        seed = json.loads((out / "data_seed.json").read_text())
        self.assertEqual(seed["data_configs"], [{"out": "../../../data/sft", "seed": 3}])
        splits = split_answers()
        for split, n, own in (("train", 5, {"cigar", "rebut"}), ("valid", 3, {"sissy"})):   # the gone round's seed
            self.assertEqual(set(seed["secrets"][split]), own | set(secrets_for(splits[split], n, 7, split)), split)
        readme = (out / "README.md").read_text()
        self.assertIn("packaged from `logs/sft-x/adapters`", readme)
        self.assertIn("guard words: new 3 / 6", readme)
        self.assertIn("its evals: the `eval_shipped_*.json` below", readme)   # which evals are the old adapter's
        self.assertIn("| `eval_sft_greedy.json` | test | none | 0.0 | words | 3 / 6 |", readme)
        self.assertEqual([p.name for p in out.parent.iterdir()], ["x-wordle"])      # no temp folder left

    def test_the_guard_keeps_a_better_shipped_adapter(self):
        self.ship_old()
        write_json(self.path, {**json.loads(self.path.read_text()),
                               "guard": [{"setting": "words", "primary": True,
                                          "new": "../eval_shipped_greedy_words.json",
                                          "shipped": "../eval_sft_greedy.json"}]})
        proc = self.run_script()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("guard words: new 2 / 6, shipped 3 / 6; won by new only 0, by shipped only 1; McNemar p 1 -> "
                      "KEEP the shipped adapter", proc.stdout)
        self.assertIn("not shipped: the new adapter has fewer wins (2 against 3) in the guard's words setting; "
                      "adapters/x-wordle left as it was", proc.stdout)
        self.assertEqual((self.out / "old.txt").read_text(), "the shipped package")
        self.assertEqual((self.out / "adapters.safetensors").read_bytes(), b"\0" * 64)

    def test_nothing_shipped_yet_ships_without_a_guard(self):
        result = ship(self.cfg)
        self.assertEqual((result["shipped"], result["guard"]), (True, []))
        self.assertTrue((self.out / "stage_seconds.json").is_file())

    def test_a_stage_without_its_seconds_is_refused_in_one_line(self):
        (self.markers / "sft.done").unlink()
        proc = self.run_script()
        self.assertEqual(proc.returncode, 2, proc.stdout)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        self.assertIn("sft.done: missing: stage sft has not finished", proc.stderr)
        self.assertFalse(self.out.exists())
        self.assertEqual(list((self.root / "adapters").glob(".*")) if (self.root / "adapters").exists() else [], [])

    def test_refusals_leave_the_shipped_folder(self):
        self.ship_old()
        write_json(self.path, {**json.loads(self.path.read_text()), "guard": []})
        (self.adapter / "adapter_config.json").unlink()
        with self.assertRaisesRegex(UserError, "adapter_config.json: missing"):
            ship(ShipConfig(**{**self.cfg.model_dump(), "guard": []}))
        proc = self.run_script()
        self.assertEqual(proc.returncode, 2)
        self.assertIn("adapter_config.json: missing", proc.stderr)
        write_json(self.path, {**json.loads(self.path.read_text()), "gaurd": []})
        proc = self.run_script()
        self.assertEqual(proc.returncode, 2)
        self.assertRegex(proc.stderr.strip(), r"^error: \S+ship.json: gaurd: unknown field \(got \[\]\)$")
        self.assertEqual((self.out / "old.txt").read_text(), "the shipped package")


class GuardInTheRecipeTest(unittest.TestCase):
    def test_the_guard_starts_with_the_decoding_the_adapter_records(self):
        """A ship entry whose guard leaves out the decoding its adapter records is a one-line error."""
        from wordle_mlx.stages.recipe_build import build_chain
        from wordle_mlx.stages.recipe_file import expand, load_recipe
        from wordle_mlx.stages.recipe_model import model_settings

        recipe = json.loads(json.dumps(TINY_RECIPE))
        recipe["stages"][-1]["guard"] = ["free", "seeded"]
        with tempfile.TemporaryDirectory() as tmp:
            path = write_json(Path(tmp) / "recipe.json", recipe)
            loaded, settings = load_recipe(path), model_settings(TINY)
            with self.assertRaisesRegex(UserError, r"stage ship: guard: must include the decoding the adapter it "
                                                   r"ships records \(words\), the guard's first comparison "
                                                   r"\(got \['free', 'seeded'\]\)$"):
                build_chain(loaded, expand(loaded, settings.size), settings, ship_exists=True)
            stages = build_chain(loaded, expand(loaded, settings.size), settings, ship_exists=False)
            self.assertEqual(stages[-1].config.guard, [])                   # nothing shipped: no guard


TINY = "builtin:tiny-random"
TINY_RECIPE = {"players": {"sft": "sft"}, "stages": [
    {"stage": "model", "kind": "model"},
    {"stage": "data", "kind": "data", "config": {"train_examples": 8, "valid_examples": 4}},
    {"stage": "sft", "kind": "sft", "config": {
        "data": {"batch_size": 2}, "run": {"steps": 2}, "validation": {"every": 0}, "decode": "words",
        "lora": {"rank": 4}}},
    {"kind": "eval", "setting": "greedy", "players": ["sft"], "config": {"rollout": {"max_tokens_per_turn": 12}}},
    {"kind": "eval", "setting": "seeded", "players": ["sft"], "config": {"rollout": {"max_tokens_per_turn": 12}}},
    {"stage": "ship", "kind": "ship", "guard": ["words", "seeded"],
     "config": {"rollout": {"max_tokens_per_turn": 12}}}]}


class TinyRecipeShipsTest(unittest.TestCase):
    """The real runner on the tiny model: the first run ships (nothing in the tree); with its ship stage undone
    and run again, the adapter in the tree plays the new one's games and the guard compares the two, equal."""

    def recipe(self, folder: Path) -> str:
        proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "recipe", "recipe.json", "--model", TINY,
                               "--games", "4", "--no-progress"], cwd=folder,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=900)
        self.assertEqual(proc.returncode, 0, (proc.stdout + proc.stderr)[-3000:])
        return proc.stdout

    def test_ships_then_guards(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            write_json(folder / "recipe.json", TINY_RECIPE)
            first = self.recipe(folder)
            out = folder / "adapters" / "tiny-random-wordle"
            self.assertIn("shipped logs/sft-tiny-random/adapters -> adapters/tiny-random-wordle", first)
            seconds = json.loads((out / "stage_seconds.json").read_text())
            self.assertEqual(list(seconds), ["model", "data", "sft", "eval-sft-greedy", "eval-sft-seeded"])
            self.assertEqual({p.name for p in (out / "recipe").iterdir()},
                             {"data.json", "sft.json", "eval-sft-greedy.json", "eval-sft-seeded.json", "ship.json"})
            self.assertEqual({p.name for p in out.glob("eval_*.json")},
                             {"eval_sft_greedy.json", "eval_sft_seeded.json"})
            self.assertEqual(json.loads((out / "recipe.json").read_text()), TINY_RECIPE)
            from tests.test_configs import ShippedConfigTest
            ShippedConfigTest().check_recipe_package(out)           # what the suite checks of a shipped package
            (folder / "logs" / "recipe-tiny-random" / "ship.done").unlink()   # ship again, an adapter now in the tree
            second = self.recipe(folder)
            self.assertRegex(second, r"guard words: new (\d) / 4, shipped \1 / 4; won by new only 0, by shipped only 0;"
                                     r" McNemar p 1 -> ok")
            self.assertRegex(second, r"guard seeded: new (\d) / 4, shipped \1 / 4;")
            self.assertIn("shipped logs/sft-tiny-random/adapters", second)
            self.assertEqual(list(json.loads((out / "stage_seconds.json").read_text()))[-2:],
                             ["eval-shipped-words", "eval-shipped-seeded"])
            self.assertTrue((out / "eval_shipped_seeded.json").is_file())


if __name__ == "__main__":
    unittest.main()

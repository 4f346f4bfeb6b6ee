"""scripts/ship_adapter.py: the folder it writes (adapter, recipe configs in order, data seed, eval JSON, stage
seconds) and its refusals (a missing adapter file, a missing data folder), which leave no folder behind; a self-play
round whose folder is gone contributes the secrets its seed plays; the guard keeps a better shipped adapter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from wordle_mlx.game.splits import split_answers
from wordle_mlx.stages.choice import secrets_for

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "ship_adapter.py"


def write_json(path: Path, obj: dict) -> Path:
    path.write_text(json.dumps(obj))
    return path


class ShipAdapterTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.root = Path(self._tmp.name)
        self.adapter = self.root / "run" / "adapters"
        self.adapter.mkdir(parents=True)
        (self.adapter / "adapters.safetensors").write_bytes(b"\0" * 64)
        write_json(self.adapter / "adapter_config.json", {"fine_tune_type": "lora"})
        data = self.root / "data"
        data.mkdir()
        for split, secrets in (("train", ["cigar", "rebut", "cigar"]), ("valid", ["sissy"])):
            (data / f"{split}.jsonl").write_text(
                "".join(json.dumps({"messages": [], "meta": {"secret": s}}) + "\n" for s in secrets))
        self.data_cfg = write_json(self.root / "data.json", {"out": "data", "seed": 3})
        self.sft_cfg = write_json(self.root / "sft.json", {"run": {"steps": 1}})
        self.grpo_cfgs = [write_json(self.root / f"grpo_stage{i}.json", {"run": {"name": f"g{i}"}}) for i in (1, 2)]
        self.eval = write_json(self.root / "eval_grpo_greedy.json", {
            "split": "test", "history": "none", "temperature": 0.0, "wins": 3, "games": 10, "win_rate": 0.3,
            "win_rate_ci95": [0.1, 0.6], "format_error_rate": 0.0, "invalid_rate": 0.25})
        self.out = self.root / "shipped"

    def tearDown(self):
        self._tmp.cleanup()

    def ship(self, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), "--adapter", str(self.adapter), "--out", str(self.out),
                               "--data-config", str(self.data_cfg), "--sft-config", str(self.sft_cfg), *extra],
                              capture_output=True, text=True)

    def test_writes_adapter_recipe_in_order_seed_and_evals(self):
        grpo = [a for path in self.grpo_cfgs for a in ("--grpo-config", str(path))]
        proc = self.ship(*grpo, "--eval", str(self.eval))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual((self.out / "adapters.safetensors").read_bytes(), b"\0" * 64)
        recipe = self.out / "recipe"
        self.assertEqual(sorted(p.name for p in recipe.iterdir()), ["data.json", "grpo_1.json", "grpo_2.json",
                                                                    "sft.json"])
        self.assertEqual(json.loads((recipe / "grpo_2.json").read_text())["run"]["name"], "g2")
        seed = json.loads((self.out / "data_seed.json").read_text())
        self.assertEqual(seed["secrets"], {"train": ["cigar", "rebut"], "valid": ["sissy"]})
        self.assertEqual(seed["data_configs"], [{"out": "data", "seed": 3}])
        self.assertIn("| 3 / 10 | 30.0% (10.0-60.0) |", (self.out / "README.md").read_text())
        self.assertTrue((self.out / "eval_grpo_greedy.json").is_file())
        self.assertEqual([p.name for p in self.root.iterdir() if p.name.startswith(".shipped")], [])

    def test_sft_config_flags_are_recorded_applied(self):
        """A pass run as `sft --config FILE --seed 2 ...` is recorded as FILE with the flags applied; a start
        adapter given relative to the working folder is recorded relative to the config's folder."""
        (self.root / "cfg").mkdir()
        more = write_json(self.root / "cfg" / "more.json", {"run": {"steps": 120, "seed": 0, "name": "a"}})
        start = self.root / "logs" / "prev" / "adapters"
        proc = self.ship("--sft-config", f"{more} --seed 2 --run-name b --adapter {start} --steps 240")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        recorded = json.loads((self.out / "recipe" / "sft_2.json").read_text())
        self.assertEqual(recorded, {"run": {"steps": 240, "seed": 2, "name": "b"},
                                    "model": {"adapter": "../logs/prev/adapters"}})
        proc = self.ship("--sft-config", f"{more} --lr 2")
        self.assertEqual(proc.returncode, 1)
        self.assertIn("unknown flag --lr", proc.stderr)
        self.assertEqual(json.loads((self.out / "recipe" / "sft_2.json").read_text()), recorded)   # left as it was

    def test_one_grpo_config_keeps_its_plain_name(self):
        proc = self.ship("--grpo-config", str(self.grpo_cfgs[0]))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue((self.out / "recipe" / "grpo.json").is_file())

    def test_a_round_whose_folder_is_gone_adds_the_secrets_its_seed_plays(self):
        choice = write_json(self.root / "choice.json", {"out": "gone", "seed": 7, "train_games": 5,
                                                         "valid_games": 3})
        proc = self.ship("--choice-config", str(choice))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("gone: not here", proc.stderr)
        splits = split_answers()
        seed = json.loads((self.out / "data_seed.json").read_text())
        for split, n, own in (("train", 5, {"cigar", "rebut"}), ("valid", 3, {"sissy"})):
            played = set(secrets_for(splits[split], n, 7, split))
            self.assertEqual(set(seed["secrets"][split]), own | played, split)
        self.assertTrue((self.out / "recipe" / "choice_1.json").is_file())

    def guard_evals(self, new_wins: int, shipped_wins: int, **shipped) -> tuple[Path, Path]:
        def eval_json(name: str, wins: int, **extra) -> Path:
            records = [{"secret": w, "won": i < wins, "guesses": [w]} for i, w in enumerate(["cigar", "rebut", "sissy"])]
            return write_json(self.root / name, {"split": "test", "history": "none", "temperature": 0.0, "decode": "words",
                                                 "wins": wins, "games": 3, "win_rate": wins / 3, "win_rate_ci95": [0, 1],
                                                 "format_error_rate": 0.0, "invalid_rate": 0.0, "game_records": records,
                                                 **extra})
        return eval_json("eval_new_greedy.json", new_wins), eval_json("eval_shipped_greedy.json", shipped_wins, **shipped)

    def ship_once(self) -> None:
        proc = self.ship()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        (self.out / "old.txt").write_text("the shipped package")

    def test_the_guard_keeps_a_better_shipped_adapter(self):
        self.ship_once()
        new, shipped = self.guard_evals(1, 2)
        (self.adapter / "adapters.safetensors").write_bytes(b"\1" * 64)
        proc = self.ship("--guard", str(new), str(shipped), "--eval", str(new))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("not shipped: the new adapter wins 1 / 3 greedy test games in words decoding, the shipped one 2",
                      proc.stderr)
        self.assertEqual((self.out / "old.txt").read_text(), "the shipped package")      # left untouched
        self.assertEqual((self.out / "adapters.safetensors").read_bytes(), b"\0" * 64)
        self.assertFalse((self.out / "eval_new_greedy.json").exists())

    def test_every_guard_pair_must_hold(self):
        """Level in words decoding but worse in free decoding: not shipped (the recipe guards both)."""
        self.ship_once()
        words_new, words_shipped = (p.rename(p.with_name(f"words_{p.name}")) for p in self.guard_evals(2, 2))
        free_new, free_shipped = self.guard_evals(1, 2, decode="free")
        write_json(free_new, {**json.loads(free_new.read_text()), "decode": "free"})
        (self.adapter / "adapters.safetensors").write_bytes(b"\1" * 64)
        proc = self.ship("--guard", str(words_new), str(words_shipped), "--guard", str(free_new), str(free_shipped))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("not shipped: the new adapter wins 1 / 3 greedy test games in free decoding, the shipped one 2",
                      proc.stderr)
        self.assertEqual((self.out / "adapters.safetensors").read_bytes(), b"\0" * 64)

    def test_the_guard_ships_an_adapter_at_least_as_good_with_its_stage_seconds(self):
        self.ship_once()
        new, shipped = self.guard_evals(2, 2)
        (self.adapter / "adapters.safetensors").write_bytes(b"\1" * 64)
        marks = self.root / "marks"
        marks.mkdir()
        (marks / "sft.done").write_text("783\n")
        proc = self.ship("--guard", str(new), str(shipped), "--stage-seconds", str(marks))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual((self.out / "adapters.safetensors").read_bytes(), b"\1" * 64)
        self.assertFalse((self.out / "old.txt").exists())
        self.assertEqual(json.loads((self.out / "stage_seconds.json").read_text()), {"sft": 783})

    def test_the_guard_refuses_evals_it_cannot_compare(self):
        self.ship_once()
        for shipped_fields, reason in (({"decode": "grammar"}, "the guard compares the same decoding"),
                                       ({"temperature": 0.7}, "temperature is 0.7")):
            new, shipped = self.guard_evals(3, 0, **shipped_fields)
            proc = self.ship("--guard", str(new), str(shipped))
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn(reason, proc.stderr)
            self.assertEqual((self.out / "old.txt").read_text(), "the shipped package")
        proc = self.ship("--guard", str(new), str(self.root / "missing.json"))
        self.assertIn("no eval of the shipped adapter", proc.stderr)
        proc = self.ship("--guard", str(self.root / "missing.json"), str(shipped))
        self.assertIn("no eval of the new adapter", proc.stderr)
        self.assertEqual((self.out / "old.txt").read_text(), "the shipped package")

    def test_the_guard_ships_when_nothing_was_shipped_yet(self):
        new, _ = self.guard_evals(0, 0)
        proc = self.ship("--guard", str(new), str(self.root / "missing.json"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue((self.out / "adapters.safetensors").is_file())

    def test_missing_adapter_file_is_refused(self):
        (self.adapter / "adapter_config.json").unlink()
        proc = self.ship()
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("adapter_config.json: missing", proc.stderr)
        self.assertFalse(self.out.exists())

    def test_missing_data_folder_is_refused_and_an_old_folder_survives(self):
        self.out.mkdir()
        (self.out / "old.txt").write_text("kept")
        (self.root / "data" / "valid.jsonl").unlink()
        proc = self.ship()
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("valid.jsonl: missing", proc.stderr)
        self.assertEqual((self.out / "old.txt").read_text(), "kept")


if __name__ == "__main__":
    unittest.main()

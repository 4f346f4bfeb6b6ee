"""Tests for `wordle-mlx plot`: the arithmetic, reading metrics/eval files, the PNGs and the CLI.

Inputs are synthetic metrics.jsonl / eval JSON files made by the small generators below (the SFT and
GRPO stages that write real ones are tested elsewhere), following docs/METRICS.md.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
from matplotlib.image import imread
from typer.testing import CliRunner

from wordle_mlx.cli import app
from wordle_mlx.errors import UserError
from wordle_mlx.plots.runlog import load_run, load_series
from wordle_mlx.plots.stats import (centered_mean, cumulative_wins, is_noisy, markdown_table, mcnemar_exact_p,
                                    outcome_histogram, paired_counts, rolling_win_rate, wilson_interval)
from wordle_mlx.stages.plot import PlotConfig, list_option_values, run

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("win", "early", "format", "valid", "consistent", "info_gain", "repeat", "length")
WORDS = ("crane", "slate", "pious", "lemon", "brisk", "fjord", "gawky", "mirth")


def make_game(rng: random.Random, p_win: float) -> dict:
    secret = rng.choice(WORDS)
    if rng.random() < p_win:
        n = rng.randint(1, 6)
        guesses = [rng.choice(WORDS) for _ in range(n - 1)] + [secret]
        return {"secret": secret, "won": True, "guesses": guesses}
    return {"secret": secret, "won": False, "guesses": ["aaaaa"] * rng.randint(1, 6)}


def make_metrics(steps: int = 12, games_per_step: int = 4, valid_every: int = 5, seed: int = 0,
                 sft: bool = False, old_kinds: bool = False, sft_games: int = 0) -> list[dict]:
    """Records of a synthetic GRPO run (or an SFT run with `sft=True`: `sft_games` games a validation pass, in the
    kinds SFT wrote before `train` / `valid` with `old_kinds`), run line first."""
    rng = random.Random(seed)
    records: list[dict] = [{"kind": "run", "stage": "sft" if sft else "grpo", "run": "synthetic-run",
                            "config_hash": "abc1234567", "config": {}, "time": 0.0, "resumed_from_step": None}]
    train_kind, valid_kind = ("sft", "sft_valid") if old_kinds else ("train", "valid")
    for step in range(1, steps + 1):
        p = min(0.9, 0.1 + step / steps)
        if sft:
            records.append({"kind": train_kind, "step": step, "time": float(step), "lr": 2e-4, "loss": 2.0 / step,
                            "grad_norm": 1.0, "tokens": 4096, "tokens_per_second": 100.0 + step, "peak_memory_gb": 1.0})
            if step % valid_every == 0:
                record = {"kind": valid_kind, "step": step, "val_loss": 2.5 / step}
                if sft_games:
                    games = [make_game(rng, p) for _ in range(sft_games)]
                    record.update(win_rate=sum(g["won"] for g in games) / sft_games, format_error_rate=0.1,
                                  games=games)
                records.append(record)
            continue
        games = [make_game(rng, p) for _ in range(games_per_step)]
        wins = sum(g["won"] for g in games)
        records.append({
            "kind": "train", "step": step, "time": float(step), "lr": 1e-5 * min(1.0, step / 3), "loss": rng.gauss(0, 0.1),
            "kl": 0.001 * step, "grad_norm": abs(rng.gauss(1, 0.3)), "reward_mean": rng.random(), "reward_std": 0.5,
            "rewards": {name: {"mean": rng.random(), "std": 0.1} for name in COMPONENTS},
            "win_rate": wins / len(games), "mean_guesses": None, "format_error_rate": 0.5 / step,
            "invalid_rate": 0.1, "repeat_rate": 0.02, "skipped_groups": 0, "skipped_group_share": 0.0, "new_field_nobody_knows": [1, 2],
            "games": games})
        if step % valid_every == 0:
            vgames = [make_game(rng, p) for _ in range(6)]
            records.append({"kind": "valid", "step": step, "time": float(step),
                            "win_rate": sum(g["won"] for g in vgames) / 6, "mean_guesses": 4.0,
                            "format_error_rate": 0.0, "invalid_rate": 0.05, "repeat_rate": 0.0, "games": vgames})
    return records


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def make_eval(outcomes: list[int], model: str = "builtin:gemma-3-270m", adapter: str | None = None,
              with_solver: bool = True) -> dict:
    records = [{"secret": "crane", "won": o > 0, "guesses": ["slate"] * max(o - 1, 0) + ["crane"] if o else ["slate"] * 6}
               for o in outcomes]
    hist = outcome_histogram(outcomes)
    wins = sum(o > 0 for o in outcomes)
    result = {"kind": "eval", "model": model, "adapter": adapter, "split": "test", "games": len(outcomes),
              "wins": wins, "win_rate": wins / len(outcomes), "histogram": hist, "format_error_rate": 0.01,
              "invalid_rate": 0.05, "repeat_rate": 0.02, "game_records": records}
    if with_solver:
        result["baselines"] = {"solver": {"games": 4, "wins": 4, "histogram": {"1": 0, "2": 0, "3": 2, "4": 2, "5": 0,
                                                                              "6": 0, "lost": 0}}}
    return result


def check_png(test: unittest.TestCase, path: Path) -> None:
    """The PNG decodes, is 800x450, is not blank, and is small."""
    image = imread(path)
    test.assertEqual(image.shape[:2], (450, 800), path.name)
    rgb = image[..., :3]
    test.assertGreater(float(rgb.std()), 0.01, f"{path.name} looks blank")
    test.assertGreater(len(np.unique(rgb.reshape(-1, 3), axis=0)), 10, f"{path.name} has almost no colours")
    test.assertLess(path.stat().st_size, 200_000, f"{path.name} is {path.stat().st_size} bytes")


def quiet_run(cfg: PlotConfig) -> tuple[dict, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        result = run(cfg)
    return result, out.getvalue(), err.getvalue()


class TestArithmetic(unittest.TestCase):
    def test_cumulative_wins_hand_count(self):
        # lost, won in 3, won in 1, lost, lost, won in 6
        x, y = cumulative_wins([0, 3, 1, 0, 0, 6])
        self.assertEqual(x.tolist(), [1, 2, 3, 4, 5, 6])
        self.assertEqual(y.tolist(), [0, 1, 2, 2, 2, 3])
        x, y = cumulative_wins([])
        self.assertEqual((len(x), len(y)), (0, 0))

    def test_rolling_win_rate_partial_then_full_window(self):
        x, y = rolling_win_rate([1, 0, 2, 0, 0, 0], window=3)
        self.assertEqual(x.tolist(), [1, 2, 3, 4, 5, 6])
        np.testing.assert_allclose(y, [1.0, 0.5, 2 / 3, 1 / 3, 1 / 3, 0.0])
        with self.assertRaises(ValueError):
            rolling_win_rate([1], window=0)

    def test_smoothing(self):
        np.testing.assert_allclose(centered_mean([4.0, 0.0, 2.0, 6.0, 1.0], 3), [2.0, 2.0, 8 / 3, 3.0, 3.5])
        np.testing.assert_allclose(centered_mean([1.0, 2.0, 3.0], 1), [1.0, 2.0, 3.0])
        rng = np.random.default_rng(0)
        self.assertTrue(is_noisy(rng.normal(size=500)))
        self.assertTrue(is_noisy(np.linspace(2, 0, 500) + rng.normal(scale=0.2, size=500)))
        self.assertFalse(is_noisy(2.0 / np.arange(1, 501)))  # a clean falling loss is drawn as is
        self.assertFalse(is_noisy(np.full(500, 1e-5)))

    def test_histogram_and_wilson(self):
        self.assertEqual(outcome_histogram([0, 3, 3, 6, 1]),
                         {"1": 1, "2": 0, "3": 2, "4": 0, "5": 0, "6": 1, "lost": 1})
        lo, hi = wilson_interval(61, 200)  # reference: 0.2449, 0.3719
        self.assertAlmostEqual(lo, 0.2449, places=3)
        self.assertAlmostEqual(hi, 0.3719, places=3)
        self.assertEqual(wilson_interval(0, 10)[0], 0.0)
        self.assertEqual(wilson_interval(10, 10)[1], 1.0)

    def test_mcnemar_exact(self):
        # reference: R binom.test(7, 31)$p.value = 0.003327
        self.assertAlmostEqual(mcnemar_exact_p(7, 24), 0.003327, places=6)
        self.assertAlmostEqual(mcnemar_exact_p(24, 7), 0.003327, places=6)
        self.assertEqual(mcnemar_exact_p(3, 0), 0.25)            # 2 * (1/2)^3
        self.assertEqual(mcnemar_exact_p(0, 5), 0.0625)
        self.assertEqual(mcnemar_exact_p(4, 4), 1.0)
        self.assertEqual(mcnemar_exact_p(0, 0), 1.0)
        with self.assertRaises(ValueError):
            mcnemar_exact_p(-1, 2)

    def test_paired_counts_match_by_secret_and_occurrence(self):
        a = (["crane", "slate", "crane", "abbey"], [True, False, False, True])
        b = (["abbey", "crane", "crane", "slate"], [False, True, True, True])  # other order, same multiset
        self.assertEqual(paired_counts(*a, *b), {"both": 1, "only_a": 1, "only_b": 2, "neither": 0})
        self.assertIsNone(paired_counts(*a, ["crane", "slate", "abbey", "abbey"], [True] * 4))
        self.assertIsNone(paired_counts(*a, ["crane"], [True]))

    def test_markdown_table(self):
        table = markdown_table([{"label": "a", "games": 200, "wins": 61, "mean_guesses": 4.25, "invalid_rate": 0.05},
                                {"label": "b", "games": 4, "wins": 4, "mean_guesses": 3.5}])
        lines = table.strip().splitlines()
        self.assertEqual(len(lines), 4)
        self.assertIn("30.5% (24.5-37.2)", lines[2])
        self.assertIn("4.25", lines[2])
        self.assertIn("5.0%", lines[2])
        self.assertNotIn("format errors", lines[0])  # no row has it
        self.assertTrue(lines[3].endswith("| - |"))


class TestReadMetrics(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())

    def test_games_in_order_and_resume_drops_replayed_steps(self):
        recs = make_metrics(steps=6, games_per_step=2, valid_every=3)
        recs.append({"kind": "run", "run": "synthetic-run", "config_hash": "abc1234567", "resumed_from_step": 4})
        recs.append({"kind": "train", "step": 5, "games": [{"secret": "crane", "won": True, "guesses": ["crane"]}]})
        log = load_run(write_jsonl(self.tmp / "m.jsonl", recs))
        self.assertEqual([r["step"] for r in log.records["train"]], [1, 2, 3, 4, 5])
        self.assertEqual(log.train_outcomes()[-1], 1)
        self.assertEqual(len(log.train_outcomes()), 4 * 2 + 1)
        self.assertEqual(len(log.valid_outcomes()), 6)  # the step-6 pass was dropped
        self.assertEqual(log.resumes, 1)

    def test_malformed_line_names_line_number(self):
        path = self.tmp / "m.jsonl"
        lines = [json.dumps(r) for r in make_metrics(steps=3)]
        lines.insert(2, "{not json")
        path.write_text("\n".join(lines) + "\n")
        with self.assertRaises(UserError) as ctx:
            load_run(path)
        self.assertIn("m.jsonl:3:", str(ctx.exception))

    def test_bad_field_type_names_line_and_field(self):
        recs = make_metrics(steps=3)
        recs[2]["loss"] = "high"
        with self.assertRaisesRegex(UserError, r"m\.jsonl:3: field 'loss'"):
            load_run(write_jsonl(self.tmp / "m.jsonl", recs))
        recs = make_metrics(steps=3)
        recs[1]["games"][0].update(won=True, guesses=["a"] * 7)
        with self.assertRaisesRegex(UserError, r"m\.jsonl:2: games\[0\] is won in 7 guesses"):
            load_run(write_jsonl(self.tmp / "m.jsonl", recs))

    def test_truncated_last_line_is_skipped_with_warning(self):
        path = self.tmp / "m.jsonl"
        recs = make_metrics(steps=3, valid_every=100)
        path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"kind": "train", "step": 4, "ga')
        err = io.StringIO()
        with redirect_stderr(err):
            log = load_run(path)
        self.assertEqual(len(log.records["train"]), 3)
        self.assertIn("m.jsonl:5: skipping truncated last line", err.getvalue())

    def test_empty_missing_and_gameless_files(self):
        (self.tmp / "empty.jsonl").write_text("")
        write_jsonl(self.tmp / "runonly.jsonl", make_metrics(steps=0))
        write_jsonl(self.tmp / "bare.jsonl", make_metrics(steps=0) + [{"kind": "train", "step": 1, "games": []}])
        for name, pattern in (("empty.jsonl", "file is empty"), ("missing.jsonl", "file not found"),
                              ("runonly.jsonl", "no games or training steps"), ("bare.jsonl", "no games, rewards")):
            out = self.tmp / f"out-{name}"
            with self.assertRaisesRegex(UserError, pattern):
                quiet_run(PlotConfig(file=str(self.tmp / name), out=str(out)))
            self.assertFalse(out.exists(), f"{name}: wrote output anyway")


class TestRunCharts(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())

    def test_grpo_run_writes_every_chart(self):
        path = write_jsonl(self.tmp / "logs" / "r" / "metrics.jsonl", make_metrics(steps=12))
        result, stdout, _ = quiet_run(PlotConfig(file=str(path), window=10))
        expected = {"cumulative_wins.png", "win_rate.png", "rewards.png", "training.png", "guess_histogram.png",
                    "error_rates.png", "validation.png"}
        self.assertEqual({Path(f).name for f in result["files"]}, expected)
        self.assertEqual(result["skipped"], ["sft_training.png"])
        self.assertEqual(stdout.split(), result["files"])
        plots = path.parent / "plots"
        self.assertEqual({p.name for p in plots.iterdir()}, expected)  # no temp files left
        for name in expected:
            check_png(self, plots / name)

    def test_sft_run_without_games(self):
        path = write_jsonl(self.tmp / "sft.jsonl", make_metrics(steps=3, sft=True, valid_every=2))
        result, _, _ = quiet_run(PlotConfig(file=str(path), out=str(self.tmp / "o")))
        self.assertEqual([Path(f).name for f in result["files"]], ["sft_training.png"])
        check_png(self, self.tmp / "o" / "sft_training.png")

    def test_old_sft_kinds_plot_as_the_new_ones(self):
        """SFT wrote `sft` / `sft_valid` before it wrote `train` / `valid` as GRPO does: an old file still plots,
        reads into the same steps and games as the new one, and gives the same charts; SFT's validation games do
        not make a GRPO validation chart."""
        runs = {}
        for old in (True, False):
            recs = make_metrics(steps=6, valid_every=2, sft=True, old_kinds=old, sft_games=5)
            path = write_jsonl(self.tmp / ("old" if old else "new") / "metrics.jsonl", recs)
            result, _, _ = quiet_run(PlotConfig(file=str(path)))
            runs[old] = (load_run(path), [Path(f).name for f in result["files"]])
        (old_log, old_files), (new_log, new_files) = runs[True], runs[False]
        steps = [{kind: [{k: v for k, v in rec.items() if k != "line"} for rec in recs]   # "line" names the file
                  for kind, recs in log.records.items()} for log in (old_log, new_log)]
        self.assertEqual(steps[0], steps[1])
        self.assertTrue(old_log.is_sft and new_log.is_sft)
        self.assertEqual(old_files, new_files)
        self.assertEqual(new_files, ["cumulative_wins.png", "win_rate.png", "sft_training.png",
                                     "guess_histogram.png", "error_rates.png"])
        self.assertEqual(len(new_log.valid_outcomes()), 3 * 5)
        self.assertEqual(new_log.series("valid", "val_loss")[0], [2, 4, 6])
        for name in new_files:
            check_png(self, self.tmp / "old" / "plots" / name)
        old_series, = load_series(self.tmp / "old" / "metrics.jsonl", None, False)
        new_series, = load_series(self.tmp / "new" / "metrics.jsonl", None, False)
        self.assertEqual((old_series.histogram, old_series.outcomes), (new_series.histogram, new_series.outcomes))
        self.assertIn("(SFT validation games)", old_series.footnote)
        no_run_line = write_jsonl(self.tmp / "bare" / "metrics.jsonl", make_metrics(steps=4, sft=True)[1:])
        self.assertTrue(load_run(no_run_line).is_sft)      # SFT's fields tell it without a run record
        self.assertFalse(load_run(write_jsonl(self.tmp / "grpo.jsonl", make_metrics(steps=4)[1:])).is_sft)

    def test_long_run_stays_small(self):
        recs = make_metrics(steps=3000, games_per_step=2, valid_every=100, seed=3)
        path = write_jsonl(self.tmp / "long.jsonl", recs)
        result, _, _ = quiet_run(PlotConfig(file=str(path), out=str(self.tmp / "o")))
        self.assertEqual(len(result["files"]), 7)
        for f in result["files"]:
            check_png(self, Path(f))


class TestCompare(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        rng = random.Random(1)
        self.a = self.tmp / "a.json"
        self.b = self.tmp / "b.json"
        self.a.write_text(json.dumps(make_eval([rng.choice([0, 0, 3, 4, 5]) for _ in range(40)])))
        self.b.write_text(json.dumps(make_eval([0, 2, 3, 0], adapter="adapters/grpo-1")))

    def test_two_evals_and_a_run(self):
        run_file = write_jsonl(self.tmp / "run" / "metrics.jsonl", make_metrics(steps=10))
        cfg = PlotConfig(compare=[str(self.a), str(self.b), str(run_file)], labels=["base", "grpo", "run"],
                         out=str(self.tmp / "cmp"), with_baselines=True)
        result, stdout, _ = quiet_run(cfg)
        names = [Path(f).name for f in result["files"]]
        self.assertEqual(names, ["compare_cumulative_wins.png", "compare_win_distribution.png", "compare.md"])
        for f in result["files"][:2]:
            check_png(self, Path(f))
        table = (self.tmp / "cmp" / "compare.md").read_text()
        self.assertIn(table.strip(), stdout)
        rows = table.strip().splitlines()
        self.assertEqual(len(rows), 2 + 4)  # base, grpo, run, and the solver baseline once (deduplicated)
        self.assertIn("| grpo | 4 | 2 | 50.0% (15.0-85.0) | 2.50 |", table)
        self.assertIn("| solver (baseline) | 4 | 4 | 100.0%", table)
        self.assertIn("| run | 12 |", table)  # the run's validation games: 2 passes of 6

    def test_paired_table_for_evals_on_the_same_secrets(self):
        secrets = [f"w{i:02d}" for i in range(12)]

        def on(won):
            data = make_eval([3 if w else 0 for w in won], with_solver=False)
            for rec, secret in zip(data["game_records"], secrets):
                rec["secret"] = secret
            return data

        first = [True] * 3 + [False] * 9
        second = [True] * 2 + [False] + [True] * 6 + [False] * 3       # both 2, only first 1, only second 6
        (self.tmp / "p1.json").write_text(json.dumps(on(first)))
        (self.tmp / "p2.json").write_text(json.dumps(on(second)))
        result, stdout, _ = quiet_run(PlotConfig(compare=[str(self.tmp / "p1.json"), str(self.tmp / "p2.json")],
                                                 labels=["sft", "grpo"], out=str(self.tmp / "cmp")))
        table = (self.tmp / "cmp" / "compare.md").read_text()
        self.assertIn("Paired against sft", table)
        self.assertIn(f"| grpo | 12 | 2 | 6 | 1 | {mcnemar_exact_p(1, 6):.3g} |", table)
        self.assertIn(table.strip(), stdout)

    def test_label_count_mismatch(self):
        with self.assertRaisesRegex(UserError, "2 --labels for 1 --compare"):
            quiet_run(PlotConfig(compare=[str(self.a)], labels=["x", "y"], out=str(self.tmp / "cmp")))
        self.assertFalse((self.tmp / "cmp").exists())

    def test_eval_without_games_and_wrong_kind(self):
        (self.tmp / "none.json").write_text(json.dumps({"kind": "eval", "model": "m", "game_records": []}))
        (self.tmp / "cfg.json").write_text(json.dumps({"lr": 1}))
        for name, pattern in (("none.json", "no games"), ("cfg.json", "expected an eval JSON")):
            with self.assertRaisesRegex(UserError, pattern):
                quiet_run(PlotConfig(compare=[str(self.a), str(self.tmp / name)], out=str(self.tmp / "cmp")))
        self.assertFalse((self.tmp / "cmp").exists())


class TestCommandLine(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())

    def test_list_options(self):
        argv = ["plot", "--compare", "a", "b", "--out", "o", "--labels", "x", "--labels=y", "z"]
        parsed = list_option_values(argv, ["b", "z"])
        self.assertEqual(parsed, {"--compare": ["a", "b"], "--labels": ["x", "y", "z"]})
        with self.assertRaisesRegex(UserError, "unexpected argument '--windo'"):
            list_option_values(["plot", "--windo", "3"], ["--windo", "3"])
        with self.assertRaisesRegex(UserError, "unexpected argument 'a'"):
            list_option_values(["plot", "a"], ["a"])

    def test_help_shows_compare_and_labels(self):
        result = CliRunner().invoke(app, ["plot", "--help"], terminal_width=200)
        self.assertEqual(result.exit_code, 0, result.output)
        for option in ("--compare", "--labels", "--with-baselines", "--window"):
            self.assertIn(option, result.output)

    def test_cli_runner_json_and_empty_file(self):
        path = write_jsonl(self.tmp / "metrics.jsonl", make_metrics(steps=4, valid_every=2))
        result = CliRunner().invoke(app, ["plot", "--file", str(path), "--window", "5", "--json"])
        self.assertEqual(result.exit_code, 0, result.output)
        files = json.loads(result.stdout)["files"]
        self.assertEqual(len(files), 7)
        a, b = self.tmp / "a.json", self.tmp / "b.json"
        a.write_text(json.dumps(make_eval([3, 0, 4])))
        b.write_text(json.dumps(make_eval([2, 2, 0, 5])))
        result = CliRunner().invoke(app, ["plot", "--compare", str(a), str(b), "--labels", "A", "B",
                                          "--out", str(self.tmp / "cmp")])
        self.assertEqual(result.exit_code, 0, result.output)
        self.assertIn("| A | 3 | 2 |", result.stdout)
        self.assertTrue((self.tmp / "cmp" / "compare_win_distribution.png").exists())
        # A UserError from the command becomes exit code 2 and one line on stderr, inside click too.
        empty = self.tmp / "e" / "empty.jsonl"
        empty.parent.mkdir()
        empty.write_text("")
        result = CliRunner().invoke(app, ["plot", "--file", str(empty)])
        self.assertEqual(result.exit_code, 2)
        self.assertNotIsInstance(result.exception, UserError)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.assertIn("empty.jsonl: file is empty", result.stderr)
        self.assertEqual(list(empty.parent.iterdir()), [empty])

    def test_exit_code_2_and_one_line_for_empty_file(self):
        empty = self.tmp / "empty.jsonl"
        empty.write_text("")
        proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "plot", "--file", str(empty)], cwd=ROOT,
                              capture_output=True, text=True, env={"WORDLE_MLX_NO_REEXEC": "1", "PATH": "/usr/bin:/bin"})
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertEqual(proc.stdout, "")
        self.assertEqual(proc.stderr.strip().splitlines(), [f"error: {empty}: file is empty, nothing to plot"])
        self.assertFalse((self.tmp / "plots").exists())


if __name__ == "__main__":
    unittest.main()

"""Hardening: bad configs and word lists through the real CLI, eval timeouts, reward hacking, paths.

Config fuzzing drives `wordle-mlx sft|train|data|eval --config FILE` through typer's CliRunner with the
stage's `run` replaced by a recorder, so only argument and config handling is exercised: any file must
either reach `run` with a validated config or exit 2 with one line naming the file. Reward hacking
scripts adversarial policies into the rollout engine (`generate_fn`) and checks each scores strictly
below a simple valid-and-consistent policy under every shipped GRPO config (the demo's and the recipe's GRPO
stage for the 270M and the 4B). The path tests run the real
commands on the tiny model with HOME and the caches in temp folders and the working folder elsewhere.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from wordle_mlx.cli import app
from wordle_mlx.config import load_config, resolve_path
from wordle_mlx.game.feedback import feedback
from wordle_mlx.game.knowledge import candidates
from wordle_mlx.game.splits import split_words
from wordle_mlx.game.words import answers, guess_list
from wordle_mlx.llm.training import rl
from wordle_mlx.llm.play.generation import Completion
from wordle_mlx.llm.model.models import load_model
from wordle_mlx.game.rewards import Rewards
from wordle_mlx.llm.play.prompts import PromptConfig, parse_reply
from wordle_mlx.llm.play.rollout import GameSpec, RolloutConfig
from wordle_mlx.stages import data, evaluate, grpo, sft

ROOT = Path(__file__).resolve().parent.parent
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 40), max_value=10 ** 40)
    | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12)
STAGES = {"sft": (sft, sft.SFTConfig), "train": (grpo, grpo.GRPOConfig), "data": (data, data.DataConfig),
          "eval": (evaluate, evaluate.EvalConfig)}


def invoke(args: list[str]):
    return CliRunner().invoke(app, args)


class ConfigFilesThroughCli(unittest.TestCase):
    """`wordle-mlx <cmd> --config FILE`: a validated config reaches run(), anything else is exit 2, one line."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.path = Path(self.tmp.name, "bad config.json")

    def check(self, command: str, raw: bytes) -> str | None:
        """Run the command on `raw`; returns the error line, or None if the config was accepted."""
        module, model = STAGES[command]
        self.path.write_bytes(raw)
        seen = []
        with mock.patch.object(module, "run", lambda cfg, **kw: seen.append(cfg) or {}):
            result = invoke([command, "--config", str(self.path)])
        if result.exit_code == 0:
            self.assertEqual(len(seen), 1)
            self.assertIsInstance(seen[0], model)
            return None
        self.assertEqual(result.exit_code, 2, (raw[:200], result.output, result.exception))
        self.assertIsInstance(result.exception, SystemExit)          # no other exception escaped
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn(str(self.path), lines[0])
        self.assertEqual(seen, [])
        return lines[0]

    def fields(self, model) -> list[str]:
        return list(model.model_fields) + ["extra", "ünïcödé", ""]

    @FUZZ
    @given(st.sampled_from(list(STAGES)), json_values)
    def test_random_json(self, command, value):
        self.check(command, json.dumps(value).encode())

    @FUZZ
    @given(st.sampled_from(list(STAGES)), st.data())
    def test_random_values_for_real_fields(self, command, draw):
        model = STAGES[command][1]
        value = draw.draw(st.dictionaries(st.sampled_from(self.fields(model)), json_values, max_size=4))
        self.check(command, json.dumps(value).encode())

    @FUZZ
    @given(st.sampled_from(list(STAGES)), st.binary(max_size=120))
    def test_random_bytes(self, command, raw):
        self.check(command, raw)

    def test_named_bad_cases(self):
        cases = [
            ("sft", b"", "file is empty"),
            ("sft", b"   \n", "file is empty"),
            ("train", b"[1, 2]", "expected a JSON object"),
            ("data", b"{\"out\": ", "invalid JSON"),
            ("eval", b"\xff\xfe{}", "not UTF-8"),
            ("sft", b'{"stepz": 3}', "stepz: unknown field"),
            ("sft", b'{"steps": 3}', "steps: unknown field (got 3)"),
            ("sft", b'{"run": {"steps": "many"}}', "run.steps: Input should be a valid integer"),
            ("sft", b'{"data": {"batch_size": -4}}', "data.batch_size: Input should be greater than or equal to 1"),
            ("sft", b'{"optimizer": {"learning_rate": 1e400}}', "optimizer.learning_rate: Input should be a finite"),
            ("sft", b'{"run": {"seed": 100000000000000000000000000000}}', "run.seed: Input should be less than"),
            ("sft", b'{"run": {"seed": -1}}', "run.seed: Input should be greater than or equal to 0"),
            ("sft", b'{"lora": {"rank": 0}}', "lora.rank"),
            ("train", b'{"run": {"seed": -3}}', "run.seed"),
            ("train", b'{"optimizer": {"learning_rate": NaN}}', "optimizer.learning_rate"),
            ("train", b'{"rl": {"num_generations": 1}}', "rl.num_generations"),
            ("train", b'{"reward": {"format": 0}}', "reward"),
            ("train", b'{"rl": {"k_weights": [-1]}}', "rl"),
            ("train", b'{"training": {"steps": 3}}', "training: unknown field (got {\"steps\": 3})"),
            ("train", b'{"trainning": {}}', "trainning: unknown field"),
            ("data", b'{"train_examples": 0}', "train_examples"),
            ("data", b'{"mode": "\xe2\x98\x83"}', "mode"),
            ("eval", b'{"games": -1}', "games"),
            ("eval", b'{"timeout": 0}', "timeout"),
            ("eval", b'{"split": "tset"}', "split"),
            ("eval", b'{"rollout": {"seed": -1}}', "rollout.seed"),
        ]
        for command, raw, fragment in cases:
            with self.subTest(command=command, raw=raw):
                line = self.check(command, raw)
                self.assertIsNotNone(line, "accepted")
                self.assertIn(fragment, line)

    def test_missing_and_folder_config(self):
        for command in STAGES:
            result = invoke([command, "--config", str(Path(self.tmp.name, "nope.json"))])
            self.assertEqual((result.exit_code, result.stderr.count("\n")), (2, 1))
            self.assertIn("nope.json: file not found", result.stderr)
            result = invoke([command, "--config", self.tmp.name])
            self.assertIn("is a folder", result.stderr)

    def test_relative_paths_resolve_against_the_config_folder(self):
        (Path(self.tmp.name) / "sub").mkdir()
        cfg_path = Path(self.tmp.name, "sub", "sft.json")
        cfg_path.write_text(json.dumps({"data": {"folder": "d"}, "run": {"logs_dir": "../l"},
                                        "model": {"name": "builtin:tiny-random"}}))
        cfg = load_config(cfg_path, sft.SFTConfig)
        self.assertEqual(resolve_path(cfg, cfg.data.folder), cfg_path.parent / "d")
        self.assertEqual(resolve_path(cfg, cfg.run.logs_dir).resolve(), Path(self.tmp.name, "l").resolve())
        cfg_path.write_text(json.dumps({"answers_list": "my.txt"}))
        cfg = load_config(cfg_path, data.DataConfig)
        self.assertEqual(data.word_list_spec(cfg, cfg.answers_list), str(cfg_path.parent / "my.txt"))
        self.assertEqual(data.word_list_spec(cfg, "answers"), "answers")


class BadWords(unittest.TestCase):
    """Bad words in user word lists, secrets and prompt files: one line with the line number."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.dir = Path(self.tmp.name)

    def test_play_secret(self):
        for secret, fragment in [("cran", "--secret"), ("cr4ne", "--secret"), ("zzzzz", "not in the answer list"),
                                 ("", "--secret"), ("crânе", "--secret")]:
            with self.subTest(secret=secret):
                result = invoke(["play", "--model", "builtin:tiny-random", "--secret", secret])
                self.assertEqual(result.exit_code, 2, result.output)
                self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
                self.assertIn(fragment, result.stderr)

    def test_data_with_bad_custom_list_names_the_line(self):
        words = self.dir / "answers.txt"
        words.write_text("crane\nslate\ncr4ne\npious\n")
        cfg = self.dir / "data.json"
        cfg.write_text(json.dumps({"answers_list": "answers.txt", "out": "out", "progress": False}))
        result = invoke(["data", "--config", str(cfg)])
        self.assertEqual(result.exit_code, 2, result.output)
        self.assertIn(f"{words}:3: bad word 'cr4ne'", result.stderr)
        words.write_text("crane\n\nslates\n")
        result = invoke(["entropy", "--answers-list", str(words)])
        self.assertEqual(result.exit_code, 2, result.output)
        self.assertIn(f"{words}:3: bad word 'slates'", result.stderr)


class EvalTimeout(unittest.TestCase):
    def test_timeout_names_the_unfinished_game(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d, "eval.json")
            # 1 microsecond: the deadline has passed before the first turn (loading the model takes longer)
            result = invoke(["eval", "--model", "builtin:tiny-random", "--games", "3", "--no-baselines",
                             "--max-tokens", "4", "--timeout", "0.000001", "--out", str(out)])
            self.assertEqual(result.exit_code, 2, result.output)
            lines = result.stderr.strip().splitlines()
            self.assertEqual(len([ln for ln in lines if ln.startswith("error:")]), 1, result.stderr)
            first = split_words("test")[0]
            self.assertIn(f"3 game(s) unfinished, the first is game 0 (secret {first!r}", lines[-1])
            saved = json.loads(out.read_text())
            self.assertTrue(saved["timed_out"])
            self.assertEqual([u["secret"] for u in saved["unfinished"]], split_words("test")[:3])


class ScriptedPolicy:
    """A generation backend for ONE game: `choose(history, rng)` gives the reply text for the board.

    It mirrors the board itself (the greedy call's well-formed allowed word is played, as the rollout does), so
    it can stand in for a model in a GRPO rollout (the same reply for each of the G samples).
    """

    truncated = 0      # replies cut at max tokens, over all instances

    def __init__(self, tokenizer, secret: str, seeded: list[str], choose, max_tokens: int, seed: int):
        self.tok, self.secret, self.choose, self.max_tokens = tokenizer, secret, choose, max_tokens
        self.history = [(g, feedback(g, secret)) for g in seeded]
        self.rng = random.Random(seed)

    def __call__(self, prompts, cfg):
        text = self.choose(self.history, self.rng, reply_format(cfg.prompt))
        ids = self.tok.encode(text, add_special_tokens=False)
        finish = "stop"
        if len(ids) >= self.max_tokens:
            ids, finish = ids[: self.max_tokens], "length"
            ScriptedPolicy.truncated += 1
            text = self.tok.decode(ids)
        parsed = parse_reply(text, cfg.prompt.require_think, ALLOWED)
        if parsed.error is None and cfg.temperature == 0.0:    # the game goes on with the greedy reply
            self.history.append((parsed.guess, feedback(parsed.guess, self.secret)))
        return [Completion(list(ids), [-1.0] * len(ids), text, finish) for _ in prompts]


ALLOWED = frozenset(guess_list())
FIRST_ALLOWED = guess_list()[0]


def reply_format(prompt):
    """A well-formed reply in the form `prompt` asks for: a short think only if required, word or letters."""
    def reply(word: str) -> str:
        guess = " ".join(word) if prompt.guess_format == "letters" else word
        think = "<think>Keep the letters that fit.</think>\n" if prompt.require_think else ""
        return f"{think}<guess>{guess}</guess>"
    return reply


def consistent_candidate(history, rng, reply):
    return reply(rng.choice(candidates(answers(), history)))


ADVERSARIES = {
    "same word every turn": lambda h, r, reply: reply("slate"),
    "empty output": lambda h, r, reply: "",
    "junk tags": lambda h, r, reply: r.choice(["<guess>", "<think></think><guess></guess>", "<guess>crane<guess>slate</guess>",
                                        "</think><guess>crane</guess><think>", "<guess>c r a n e</guess>",
                                        "<think>x</think><guess>crane</guess><guess>slate</guess>",
                                        "<think>" + "<guess>" * 20]),
    "longest think (max tokens)": lambda h, r, reply: "<think>" + "let me think about every letter " * 40,
    "max-length think, then a guess": lambda h, r, reply: "<think>" + "hmm " * 300 + "</think><guess>crane</guess>",
    "first allowed word every turn": lambda h, r, reply: reply(FIRST_ALLOWED),
    "not a word": lambda h, r, reply: reply("qzxvj"),
}


def shipped_grpo_configs() -> list[tuple[str, "grpo.GRPOConfig"]]:
    """(name, config) of every GRPO config a user runs: config/*/grpo*.json and the GRPO stages `wordle-mlx recipe`
    builds from config/recipe.json for the 270M and the 4B."""
    from wordle_mlx.stages.recipe import build_stages

    configs = [(path.name, load_config(path, grpo.GRPOConfig))
               for path in sorted((ROOT / "config").rglob("grpo*.json"))]
    for model in ("builtin:gemma-3-270m", "mlx-community/gemma-3-4b-it-bf16"):
        _, stages = build_stages(str(ROOT / "config" / "recipe.json"), model, ship_exists=False)
        configs += [(f"recipe {s.name} {model}", s.config) for s in stages if s.kind == "grpo"]
    return configs


class RewardHacking(unittest.TestCase):
    """Each adversarial policy scores strictly below a random consistent candidate, per shipped config."""

    @classmethod
    def setUpClass(cls):
        cls.tok = load_model("builtin:tiny-random")[1]
        words = split_words("test")[:16]
        cls.specs = [GameSpec(w) for w in words[:8]] + [GameSpec(w, ["crane"]) for w in words[8:] if w != "crane"]

    def mean_reward(self, cfg: grpo.GRPOConfig, choose) -> float:
        rewards = Rewards(cfg.reward.weights(), answers())
        rcfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=cfg.max_tokens, seed=0, prompt=PromptConfig(),
                             decode="free")
        total, n = 0.0, 0
        for i, spec in enumerate(self.specs):
            policy = ScriptedPolicy(self.tok, spec.secret, spec.seeded_guesses, choose, cfg.max_tokens, i)
            out = rl.rollout(rl.Player(None, self.tok, policy), [spec], rcfg, ALLOWED, rewards, 2)
            total += sum(it.reward for it in out.items)
            n += len(out.items)
        return total / n

    def test_adversaries_score_below_a_consistent_policy_under_every_shipped_config(self):
        configs = shipped_grpo_configs()
        self.assertGreaterEqual(len(configs), 3)
        self.table = []
        for config_name, cfg in configs:
            good = self.mean_reward(cfg, consistent_candidate)
            for name, choose in ADVERSARIES.items():
                with self.subTest(config=config_name, policy=name):
                    cut = ScriptedPolicy.truncated
                    bad = self.mean_reward(cfg, choose)
                    self.assertLess(bad, good, f"{name}: {bad:.4f} >= consistent {good:.4f}")
                    if "max" in name:     # these replies really hit the token limit
                        self.assertGreater(ScriptedPolicy.truncated, cut)
                    self.table.append((config_name, name, bad, good))
        if os.environ.get("WORDLE_MLX_SHOW_REWARDS"):
            for row in self.table:
                print("%s | %s | %.4f | %.4f" % row)


class PathsAndOverwrite(unittest.TestCase):
    """Real `sft` and `train` runs write only to the run folder and the cache, and refuse to overwrite."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = Path(cls.tmp.name)
        cls.home, cls.cache, cls.xdg, cls.cwd, cls.proj = (root / n for n in ("home", "cache", "xdg", "cwd", "proj"))
        for p in (cls.home, cls.cwd, cls.proj):
            p.mkdir()
        cls.env = {**os.environ, "HOME": str(cls.home), "XDG_CACHE_HOME": str(cls.xdg),
                   "WORDLE_MLX_CACHE": str(cls.cache), "PYTHONDONTWRITEBYTECODE": "1"}
        (cls.proj / "data.json").write_text(json.dumps({"out": "data", "train_examples": 4, "valid_examples": 2}))
        (cls.proj / "sft.json").write_text(json.dumps({
            "model": {"name": "builtin:tiny-random"}, "data": {"folder": "data", "batch_size": 2},
            "run": {"logs_dir": "logs", "name": "s", "steps": 2, "save_every": 1}, "validation": {"every": 0},
            "lora": {"rank": 2}}))
        (cls.proj / "grpo.json").write_text(json.dumps({
            "model": {"name": "builtin:tiny-random", "adapter": None}, "lora": {"rank": 2},
            "optimizer": {"name": "adamw", "min_lr_ratio": 0.0},
            "run": {"steps": 2, "save_every": 1, "logs_dir": "logs", "name": "g"},
            "rl": {"batch_prompts": 1, "num_generations": 2}, "max_tokens": 4, "decode": "free",
            "validation": {"every": 0}}))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "wordle_mlx", *args, "--no-progress"], cwd=self.cwd,
                              env={**self.env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)

    def test_runs_write_only_run_folder_and_cache_and_refuse_overwrite(self):
        before = set(self.proj.iterdir())
        done = self.cli("data", "--config", str(self.proj / "data.json"))
        self.assertEqual(done.returncode, 0, done.stderr)
        for cmd, cfg, run in (("sft", "sft.json", "s"), ("train", "grpo.json", "g")):
            done = self.cli(cmd, "--config", str(self.proj / cfg))
            self.assertEqual(done.returncode, 0, done.stderr)
            run_dir = self.proj / "logs" / run
            stamp = (run_dir / "metrics.jsonl").read_bytes()
            again = self.cli(cmd, "--config", str(self.proj / cfg))
            self.assertEqual(again.returncode, 2, again.stderr)
            self.assertIn(f"run folder {run_dir} already exists; pass --overwrite", again.stderr)
            self.assertEqual(len(again.stderr.strip().splitlines()), 1, again.stderr)
            self.assertEqual((run_dir / "metrics.jsonl").read_bytes(), stamp)      # untouched
            done = self.cli(cmd, "--config", str(self.proj / cfg), "--overwrite")
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertNotEqual((run_dir / "metrics.jsonl").read_bytes(), stamp)
        self.assertEqual(list(self.cwd.iterdir()), [])                              # nothing in the cwd
        self.assertEqual(list(self.home.iterdir()), [])                             # nor in HOME
        self.assertFalse(self.xdg.exists())                                         # WORDLE_MLX_CACHE wins
        self.assertEqual(sorted(p.name for p in self.cache.iterdir()), ["models", "patterns"])
        self.assertEqual(set(self.proj.iterdir()) - before, {self.proj / "data", self.proj / "logs"})
        self.assertEqual(sorted(p.name for p in (self.proj / "logs").iterdir()), ["g", "s"])


if __name__ == "__main__":
    unittest.main()

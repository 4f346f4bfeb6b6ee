"""Every script under benchmarks/ run as a user runs it, at its smallest size, to its headline line.

docs/BENCHMARKS.md cites each script with the command that reproduces its numbers; their full runs take minutes to
hours, so nothing else would notice a renamed option, a moved function or a changed config field until someone ran
one. Each test here runs the script in a subprocess (`python benchmarks/X.py ...`, from the repo root, with a
timeout) on the tiny random model wherever the script takes a model, and checks its exit and the line(s) the docs
quote: that they are there and their numbers parse and are finite. No speed is asserted (it depends on the machine
and its load). `memory_plan.py` and `malloc_reuse.py`, which run the 270M otherwise, take `--smoke` for the tiny
model. `gemma3_4b_size.py --size tiny` has its own test, tests/test_benchmark_4b_size.py.
`test_every_script_has_a_smoke_run` fails when a script is added without one.

Scripts that play with an adapter get a random one on the tiny model that records the shipped adapter's prompt and
decoding, so they build the prompts and decode as with the shipped adapter. Every run's temporary files go to a
folder removed at the end (TMPDIR).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
TINY = "builtin:tiny-random"
TIMEOUT = 600                       # seconds a run may take before it is killed (its normal time is seconds)
NUMBER = r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"
# benchmark scripts whose smoke run lives in another test module
ELSEWHERE = {"gemma3_4b_size.py": "tests/test_benchmark_4b_size.py"}

_tmp: tempfile.TemporaryDirectory | None = None
_adapter: Path | None = None


def setUpModule():
    global _tmp
    _tmp = tempfile.TemporaryDirectory(prefix="benchmark-smoke-")


def tearDownModule():
    _tmp.cleanup()


def tiny_adapter() -> str:
    """A random LoRA adapter on the tiny model (made once) that records the shipped adapter's prompt and decoding."""
    global _adapter
    if _adapter is None:
        from tests.dtype_models import write_adapter

        folder = Path(_tmp.name) / "tiny-adapter"
        write_adapter(folder)
        config = json.loads((folder / "adapter_config.json").read_text())
        shipped = json.loads((ROOT / "adapters" / "gemma-3-270m-wordle" / "adapter_config.json").read_text())
        config.update({k: shipped[k] for k in ("wordle_prompt", "decode", "trained_free")})
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
        _adapter = folder
    return str(_adapter)


def tiny_sft_config() -> str:
    """A `train_free` SFT config on the tiny model with 16 examples of the recipe's data format, beside its data."""
    from wordle_mlx.stages import data

    folder = Path(_tmp.name) / "tiny-sft"
    prompt = {"require_think": False, "context": "summary", "style": "compact", "guess_format": "letters"}
    data.run(data.DataConfig(out=str(folder / "data"), train_examples=16, valid_examples=2, think_style="none",
                             prompt=prompt, progress=False))
    config = folder / "sft.json"
    config.write_text(json.dumps({"model": {"name": TINY}, "data": {"folder": "data", "batch_size": 2},
                                  "decode": "words", "train_free": True}))
    return str(config)


def run(script: str, *args: str, env: dict | None = None) -> list[str]:
    """`python benchmarks/<script> args` from the repo root; its stdout lines. Fails on a non-zero exit or when it
    runs past TIMEOUT (its whole process group is killed then, mlx.launch's ranks included)."""
    proc = subprocess.Popen([sys.executable, str(BENCHMARKS / script), *args], cwd=ROOT,
                            env={**os.environ, "TMPDIR": _tmp.name, **(env or {})}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{script} {' '.join(args)}: still running after {TIMEOUT} s\n{err[-3000:]}") from None
    if proc.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)}: exit {proc.returncode}\n{out[-2000:]}\n{err[-3000:]}")
    return out.splitlines()


class BenchmarkSmokeTest(unittest.TestCase):
    def value(self, line: str, key: str, unit: str = "") -> float:
        """The number of a headline line `KEY X` (`KEY X%` with unit "%"), checked finite and not negative."""
        match = re.fullmatch(re.escape(key) + " " + NUMBER + re.escape(unit), line.strip())
        self.assertIsNotNone(match, f"expected {key!r} X{unit}, got {line!r}")
        x = float(match[1])
        self.assertTrue(math.isfinite(x) and x >= 0, line)
        return x

    def positive(self, line: str, key: str, unit: str = "") -> float:
        x = self.value(line, key, unit)
        self.assertGreater(x, 0, line)
        return x

    def line_starting(self, lines: list[str], start: str) -> str:
        found = [line for line in lines if line.lstrip().startswith(start)]
        self.assertTrue(found, f"no line starting {start!r} in:\n" + "\n".join(lines[-20:]))
        return found[-1]

    def test_every_script_has_a_smoke_run(self):
        scripts = {p.name for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py"}
        here = {name[len("test_"):] + ".py" for name in dir(self) if name.startswith("test_")}
        self.assertEqual(sorted(scripts - here - set(ELSEWHERE)), [], "benchmarks without a smoke run")
        for script, test in ELSEWHERE.items():
            self.assertIn(f"benchmarks/{script}", (ROOT / test).read_text(), test)

    def test_entropy_speed(self):
        lines = run("entropy_speed.py", "--sample", "2")
        self.assertRegex(self.line_starting(lines, "top guess"), r": [a-z]{5} \d+\.\d{4} bits$")
        self.positive(lines[-1], "speedup")

    def test_sampler(self):
        lines = run("sampler.py", "--rows", "4", "--vocab", "1024", "--repeats", "2")
        for name in ("mlx-lm categorical", "inverse CDF (ours)"):
            freqs = [float(f) for f in self.line_starting(lines, name).split(":")[-1].split()]
            self.assertEqual(len(freqs), 6)
            self.assertAlmostEqual(sum(freqs), 1.0, delta=0.01)
        self.positive(lines[-1], "speedup")

    def test_cpu_kernels(self):
        lines = run("cpu_kernels.py", "--model", TINY, "--batch", "2", "--length", "16", "--targets", "4",
                    "--repeats", "1", "--vocab-rows", "4", "--matmul-size", "256", "--sft-config", tiny_sft_config())
        self.assertTrue(lines[0].startswith("matmul"), lines[0])
        self.line_starting(lines, "gelu (1024x2048)")
        self.line_starting(lines, "cross-entropy (4x262144 logits")
        self.assertRegex(self.line_starting(lines, "SFT step of "), r"\(train_free, 2 examples, median of 6\): "
                         r"not flushed [\d.]+ s, flushed [\d.]+ s")
        losses = re.search(r"loss " + NUMBER + " vs " + NUMBER + "$", self.line_starting(lines, "SFT LoRA step"))
        self.assertIsNotNone(losses)
        self.assertTrue(all(math.isfinite(float(x)) for x in losses.groups()), losses[0])
        self.positive(lines[-1], "speedup")

    def test_grad_checkpoint(self):
        lines = run("grad_checkpoint.py", "--model", TINY, "--batch-size", "2", "--steps", "1")
        self.positive(lines[-2], "memory ratio")
        self.positive(lines[-1], "time ratio")

    def test_grpo_update(self):
        lines = run("grpo_update.py", "--model", TINY, "--prompts", "2", "--generations", "2", "--repeats", "1")
        diff = re.search(r"max weight difference after the update " + NUMBER + "$", lines[-2])
        self.assertIsNotNone(diff, lines[-2])
        self.assertLess(float(diff[1]), 1e-5)             # shared-prompt packing computes the same update
        self.positive(lines[-1], "speedup")

    def test_fault_injection(self):
        lines = run("fault_injection.py", "--kills", "1")
        match = re.fullmatch(r"survived (\d+)/(\d+)", lines[-1])
        self.assertIsNotNone(match, lines[-1])
        self.assertEqual(match[1], match[2])
        self.assertGreaterEqual(int(match[2]), 2)         # at least one trial of sft and one of train

    def test_rollout_throughput(self):
        lines = run("rollout_throughput.py", "--model", TINY, "--games", "2", "--turns", "1", "--max-tokens", "8")
        for side in ("engine:", "sequential:"):
            self.assertRegex(self.line_starting(lines, side),
                             r":\s+[1-9]\d* tokens in [\d.]+ s = [\d.]+ game-tokens/s$")
        self.positive(lines[-1], "speedup")

    def test_sft_throughput(self):
        lines = run("sft_throughput.py", "--model", TINY, "--steps", "1", "--batch-size", "2", "--rank", "4")
        self.positive(lines[-3], "prefix speedup")
        self.positive(lines[-2], "grammar loss speedup")
        self.positive(lines[-1], "speedup")

    def test_memory_soak(self):
        lines = run("memory_soak.py", "--steps", "2", "--batch", "1", "--generations", "2")
        self.assertRegex(self.line_starting(lines, "step    2"), r"rss +[\d.]+ MB")
        self.assertRegex(lines[-1], r"^growth -?\d+\.\d%$")

    def test_distributed_scaling(self):
        from tests.test_distributed import free_ports
        from wordle_mlx.llm.training.distributed import TIMEOUT_ENV

        lines = run("distributed_scaling.py", "--steps", "2", "--batch-prompts", "2", "--generations", "2",
                    "--port", str(free_ports(2)), env={TIMEOUT_ENV: "300"})
        result = json.loads("\n".join(lines[lines.index("{"):-1]))
        for ranks in ("1_rank", "2_ranks"):
            self.assertGreater(result[ranks]["step_s"], 0)
        self.assertEqual(set(result["allsum_lora_grad_localhost"]), {"gemma-3-270m", "gemma-3-4b"})
        self.positive(lines[-1], "speedup")

    def test_greedy_continuation(self):
        lines = run("greedy_continuation.py", "--model", TINY, "--adapter", tiny_adapter(), "--boards", "2",
                    "--generations", "2", "--repeats", "1")
        prefilled = {}
        for name in ("two calls", "one batch"):
            match = re.search(r": median [\d.]+ s per rollout, (\d+) prompt tokens prefilled, ([1-9]\d*) sampled",
                              self.line_starting(lines, f"{name}: median"))
            self.assertIsNotNone(match, name)
            prefilled[name] = int(match[1])
        self.assertLess(prefilled["one batch"], prefilled["two calls"])    # the greedy row shares the prefill
        self.positive(lines[-1], "speedup")

    def test_memory_plan(self):
        lines = run("memory_plan.py", "--smoke", "--sft-batches", "1", "--grpo-boards", "1")
        for row in ("sft    batch_size 1", "grpo   batch_prompts 1"):
            self.assertRegex(self.line_starting(lines, row), r" [\d.]+ +[\d.]+ +[-+][\d.]+%$")
        self.value(lines[-1], "max_error", "%")

    def test_decode_roofline(self):
        lines = run("decode_roofline.py", "--model", TINY, "--adapter", tiny_adapter(), "--batches", "32", "64")
        rows = {tuple(line.split()[:2]) for line in lines if re.match(r"(free|grammar) +\d+ ", line)}
        self.assertEqual(rows, {(m, b) for m in ("free", "grammar") for b in ("32", "64")})
        self.positive(lines[-2], "grammar_speedup")
        self.positive(lines[-1], "roofline_fraction")

    def test_decode_profile(self):
        lines = run("decode_profile.py", "--model", TINY, "--adapter", tiny_adapter(), "--batch", "8",
                    "--repeats", "1")
        for part in ("prefill", "letter steps", "the rest"):
            self.line_starting(lines, part)
        self.assertLessEqual(self.positive(lines[-1], "prefill_share"), 1.0)

    def test_eval_speed(self):
        lines = run("eval_speed.py", "--model", TINY, "--adapter", tiny_adapter(), "--games", "2")
        self.assertRegex(self.line_starting(lines, "identical transcripts"), r": [0-2] / 2$")
        self.positive(lines[-1], "speedup")

    def test_grpo_step(self):
        # `words` too: the tiny adapter's free and grammar replies all score alike, so only words decoding runs an
        # update here (its row), and the grammar step's update_roofline_fraction is 0
        lines = run("grpo_step.py", "--model", TINY, "--adapter", tiny_adapter(), "--boards", "2",
                    "--generations", "2", "--modes", "free", "grammar", "words")
        self.assertRegex(self.line_starting(lines, "words "),
                         r"update +[\d.]+ s \([1-9]\d* trained tokens, applied True\)")
        self.value(lines[-2], "update_roofline_fraction")
        self.positive(lines[-1], "step_speedup")

    def test_malloc_reuse(self):
        lines = run("malloc_reuse.py", "--smoke", "--steps", "2", "--repeats", "1")
        for name in ("glibc defaults", "malloc tunables"):
            self.assertRegex(self.line_starting(lines, f"{name:16s} run 1:"),
                             r"median step [\d.]+ s, .*, losses identical: True$")
        self.positive(lines[-1], "speedup")


if __name__ == "__main__":
    unittest.main()

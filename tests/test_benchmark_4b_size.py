"""`benchmarks/gemma3_4b_size.py --size tiny`, run as a user runs it: every stage of the 4B chain on the tiny Mac
layouts, export included, to its last line.

The full-size run takes 40 minutes and more, so a renamed option or field (export's `gguf_type`, now `dtype`) used
to surface only there. This smoke run fails on it instead. It also checks the two `fuse VARIANT peak_gb X plan_gb
Y base_gb B out_gb O` lines: the fuse plan within 25% of MLX's measured peak. At tiny sizes the fuse's peak is
the check's vocabulary-wide logits (66 tokens x 262,208 entries), not the weights (about 0.03 GB), so the
acceptance's X <= 1.3 x max(B, O) is only meaningful at full size and is not asserted here.
"""

from __future__ import annotations

import re
import subprocess
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUSE_LINE = re.compile(r"^fuse (\w+) peak_gb ([\d.]+) plan_gb ([\d.]+) base_gb ([\d.]+) out_gb ([\d.]+)$")


class Gemma3SizeBenchmarkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gemma3_4b_size.py"), "--size", "tiny"],
                             cwd=ROOT, capture_output=True, text=True, timeout=1800)
        cls.rc, cls.lines, cls.stderr = run.returncode, run.stdout.splitlines(), run.stderr

    def test_runs_every_stage_to_its_last_line(self):
        self.assertEqual(self.rc, 0, self.stderr[-3000:])
        self.assertRegex(self.lines[-1], r"^max_error \d+\.\d%$")
        for variant in ("4bit", "bf16"):      # rows "  VARIANT STAGE      SECONDS s  NOTE"
            stages = {line[8:18].strip() for line in self.lines if line.startswith(f"  {variant:<5} ")}
            self.assertLessEqual({"plan", "data", "sft", "self-play", "cover", "grpo", "eval", "fuse", "eval fused",
                                  "export"}, stages, variant)

    def test_prints_the_fuse_peak_beside_its_plan(self):
        self.assertEqual(self.rc, 0, self.stderr[-3000:])
        found = {}
        for line in self.lines[-4:]:
            match = FUSE_LINE.match(line)
            if match:
                found[match[1]] = [float(x) for x in match.groups()[1:]]
        self.assertEqual(set(found), {"4bit", "bf16"})
        for variant, (peak, plan, base, out) in found.items():
            with self.subTest(variant=variant):
                self.assertGreater(peak, 0)
                self.assertGreater(base, 0)
                self.assertGreater(out, 0)
                self.assertLessEqual(abs(plan - peak) / peak, 0.25)
        self.assertLess(found["4bit"][2], found["4bit"][3])      # the 4-bit base fused into a larger bf16 output


if __name__ == "__main__":
    unittest.main()

"""The fuse and export plans (`planning/fuse_plan.py`): exact arithmetic on small dimensions, `wordle-mlx plan` on
fuse and export configs and commands, the 4B's fuse fitting a 16 GB Mac, and a fuse's measured peak against its
plan on the tests' tiny Mac layout (the full size is `benchmarks/gemma3_4b_size.py`'s)."""

from __future__ import annotations

import dataclasses
import gc
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx

from wordle_mlx.planning import fuse_plan as fp, memory as mp
from wordle_mlx.stages import plan
from wordle_mlx.stages.fuse_config import FuseConfig

from tests.dtype_models import write_adapter

ROOT = Path(__file__).resolve().parent.parent
SMALL = mp.ModelDims(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32,
                     sliding_window=4, sliding_window_pattern=2, value_bytes=2)
Q4 = dataclasses.replace(SMALL, bits=4, group_size=8)


class ArithmeticTest(unittest.TestCase):
    def test_float_fuse_is_the_base_plus_one_layer_and_the_logits(self):
        # LoRA rank 2 on every linear of both blocks: 2 x 2 x (8+8 + 8+4 + 8+4 + 8+8 + 8+16 + 8+16 + 16+8) = 512
        p = fp.fuse_plan(SMALL, 2, -1, None, False, tokens=10)
        fusing = {"weights": mp.weight_bytes(SMALL), "lora": 512 * 4, "output": 0,
                  "fused_layer": 128 * (fp.FUSE_CHECK_COPIES * 4 + 2), "logits": 10 * 32 * 2}
        checking = mp.weight_bytes(SMALL) + 512 * 4 + 10 * 32 * fp.FUSE_LOGIT_BYTES
        self.assertEqual(p.peak, max(sum(fusing.values()), checking))
        if sum(fusing.values()) >= checking:
            self.assertEqual(p.items, fusing)

    def test_dequantized_fuse_ends_at_the_float_output(self):
        tokens = 1000                                          # the checking phase: the output and the logits
        p = fp.fuse_plan(Q4, 1, -1, None, True, tokens)            # rank 1: 256 LoRA params, less than the growth
        dense = mp.weight_bytes(SMALL)
        self.assertEqual(p.items, {"weights": mp.weight_bytes(Q4), "output": dense - mp.weight_bytes(Q4),
                                   "logits": tokens * 32 * fp.FUSE_LOGIT_BYTES})
        self.assertEqual(p.peak, dense + tokens * 32 * fp.FUSE_LOGIT_BYTES)
        requantized = fp.fuse_plan(Q4, 1, -1, None, False, tokens)
        self.assertEqual(requantized.peak, mp.weight_bytes(Q4) + 256 * 4 + tokens * 32 * fp.FUSE_LOGIT_BYTES)

    def test_export_holds_one_tensor_in_float32(self):
        p = fp.export_plan(SMALL, 2, -1, None)
        self.assertEqual(p.items, {"weights": mp.weight_bytes(SMALL), "lora": 512 * 4,
                                   "tensor": max(32 * 8, 128) * fp.EXPORT_TENSOR_COPIES * 4})


class PlanCommandTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = Path(cls.enterClassContext(tempfile.TemporaryDirectory()))
        cls.adapter = cls.root / "adapter"
        write_adapter(cls.adapter)

    def write(self, name: str, data: dict) -> str:
        path = self.root / name
        path.write_text(json.dumps(data))
        return str(path)

    def test_fuse_and_export_configs(self):
        fuse_cfg = self.write("fuse.json", {"model": "builtin:tiny-random", "adapter": "adapter", "out": "fused",
                                            "dequantize": True})
        result = plan.run(plan.PlanConfig(config=fuse_cfg, json_output=True))
        self.assertEqual(result["stage"], "fuse")
        self.assertIn("adapter rank 4 on all blocks", result["inputs"])
        self.assertAlmostEqual(result["peak_gb"], sum(result["items_gb"].values()), places=2)
        export_cfg = self.write("export.json", {"model": "builtin:tiny-random", "adapter": "adapter",
                                                "out": "player.gguf", "ollama": False})
        self.assertEqual(plan.run(plan.PlanConfig(config=export_cfg, json_output=True))["stage"], "export")

    def test_4b_fuse_fits_a_16_gb_mac_before_the_download(self):
        for model, dequantize in (("mlx-community/gemma-3-4b-it-bf16", False),
                                  ("mlx-community/gemma-3-4b-it-4bit", True)):
            with self.subTest(model=model):
                cfg = FuseConfig(model=model, adapter=str(self.adapter), out="fused", dtype="bfloat16",
                                 dequantize=dequantize)
                result = fp.fuse_report("fuse", cfg, memory_gb=16)
                self.assertIn(16, result["fits_mac_gb"])
                text_bf16 = 3_880_263_168 * 2 / mp.GB                 # the output: the text weights in bf16
                self.assertLess(result["peak_gb"], 1.3 * text_bf16)

    def test_command_line(self):
        wordle = [sys.executable, "-m", "wordle_mlx"]
        for words in (["fuse", "--adapter", str(self.adapter), "--out", "x", "--model", "builtin:tiny-random",
                       "--dequantize"],
                      ["export", "--adapter", str(self.adapter), "--out", "x.gguf", "--model", "builtin:tiny-random",
                       "--dtype", "q8"]):
            run = subprocess.run([*wordle, "plan", "--json", *words], capture_output=True, text=True, cwd=ROOT)
            self.assertEqual(run.returncode, 0, run.stderr)
            result = json.loads(run.stdout)
            self.assertEqual((result["stage"], result["config"]), (words[0], "wordle-mlx " + " ".join(words)))
        for bad in (["plan"], ["plan", "train", "--steps", "2"], ["plan", "fuse", "--out", "x"],
                    ["plan", "--measure", "fuse", "--adapter", "a", "--out", "x"]):
            run = subprocess.run([*wordle, *bad], capture_output=True, text=True, cwd=ROOT)
            self.assertEqual(run.returncode, 2, bad)
            self.assertNotIn("Traceback", run.stderr)


class MeasuredTest(unittest.TestCase):
    def test_tiny_mac_layout_fuse_peak_within_a_quarter_of_its_plan(self):
        """At the tiny layout's size the peak is the check's logits (the weights are 0.03 GB): the plan must still
        say so within 25%."""
        from tests.rehearsal.mac_layouts import make_mac_layout
        from wordle_mlx.stages import fuse

        with tempfile.TemporaryDirectory() as tmp:
            base = make_mac_layout(Path(tmp) / "bf16", "bfloat16")
            write_adapter(Path(tmp) / "adapter", str(base))
            cfg = FuseConfig(model=str(base), adapter=str(Path(tmp) / "adapter"), out=str(Path(tmp) / "fused"),
                             dtype="bfloat16")
            gc.collect()
            mx.clear_cache()
            mx.reset_peak_memory()
            fuse.run(cfg)
            peak = mx.get_peak_memory() / mp.GB
            planned = fp.fuse_report("fuse", cfg)["peak_gb"]
        self.assertLessEqual(abs(planned - peak) / peak, 0.25, (planned, peak))


if __name__ == "__main__":
    unittest.main()

"""`wordle-mlx fuse` on bfloat16 and 4-bit bases, and on Gemma 3 4B's multimodal layout.

The fuse check's limit used to be fixed at 1e-4 of the largest logit, so a bfloat16 fuse (rounding) and a
4-bit one (mlx-lm re-quantizes the fused weights) always failed. Now each fused weight is checked against
W + scale B^T A^T within what rounding or re-quantization allows, and the logits within a limit derived from
the dtype, the number of blocks and the measured weight perturbation (`llm/model/fuse_bounds.py`). These tests fuse
a random adapter into the tiny model's bfloat16 and 4-bit (mlx-lm's converter) copies, re-quantized and
dequantized (a re-quantized fuse must keep at least half of the adapter's effect on the logits, and one that
rounds the adapter away fails), and check that the folder loads with plain `mlx_lm.load`, that its logits are within the stated
limit of the adapter model's as mlx-lm itself loads it, that config.json matches the weights, and that a
multimodal base's vision part is dropped and said to be.
"""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten

from wordle_mlx.stages import fuse

from tests.dtype_models import tiny_model_in, write_adapter


class FuseDtypesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = Path(cls.enterClassContext(tempfile.TemporaryDirectory()))

    def fuse_and_load(self, kind: str, dequantize: bool = False) -> tuple[dict, dict]:
        base = tiny_model_in(kind)
        adapter = self.root / f"adapter-{kind}"
        if not adapter.exists():
            write_adapter(adapter, base)
        out = self.root / f"fused-{kind}-{dequantize}"
        result = fuse.run(fuse.FuseConfig(model=base, adapter=str(adapter), out=str(out), dtype="bfloat16",
                                          dequantize=dequantize))
        self.assertTrue(result["within_tolerance"])
        fused, tokenizer = mlx_lm.load(str(out))                       # plain mlx-lm, as a user would
        adapted, _ = mlx_lm.load(base, adapter_path=str(adapter))
        inputs = mx.array([fuse.check_batch(tokenizer)])
        diff = mx.abs(fused(inputs).astype(mx.float32) - adapted(inputs).astype(mx.float32)).max().item()
        self.assertLessEqual(diff, result["tolerance"])
        weights = dict(tree_flatten(fused.parameters()))
        self.assertFalse(any("lora" in k for k in weights))
        config = json.loads((out / "config.json").read_text())
        self.assertEqual(config["torch_dtype"], "bfloat16")
        self.assertEqual(any(k.endswith(".scales") for k in weights), "quantization" in config)
        return result, config

    def test_bfloat16_fuse_passes_and_loads(self):
        result, _ = self.fuse_and_load("bfloat16")
        self.assertEqual(result["output"], "float")
        self.assertGreater(result["max_abs_logit_diff"], 1e-4 * result["max_abs_logit"])  # above the old limit

    def test_4bit_fuse_requantizes_by_default_and_dequantizes_when_asked(self):
        result, config = self.fuse_and_load("4bit")
        self.assertEqual((result["output"], config["quantization"]["bits"]), ("re-quantized", 4))
        self.assertLessEqual(result["max_abs_logit_diff"], 0.5 * result["adapter_effect"])  # it keeps the adapter
        result, config = self.fuse_and_load("4bit", dequantize=True)
        self.assertEqual(result["output"], "dequantized")
        self.assertNotIn("quantization", config)
        self.assertNotIn("quantization_config", config)

    def test_multimodal_base_fuses_to_a_text_only_folder(self):
        for kind in ("bfloat16-multimodal", "4bit-multimodal"):
            with self.subTest(base=kind):
                result, config = self.fuse_and_load(kind)
                self.assertEqual(result["vision"], fuse.VISION_NOTE)
                self.assertNotIn("vision_config", config)
                self.assertEqual(config["model_type"], "gemma3")
                out = Path(result["out"])
                stored = [k for f in out.glob("model*.safetensors") for k in mx.load(str(f))]
                self.assertFalse(any(k.startswith(("vision_tower", "multi_modal_projector")) for k in stored))
        _, config = self.fuse_and_load("4bit-multimodal", dequantize=True)     # no quantization left anywhere
        self.assertFalse({"quantization", "quantization_config"} & (set(config) | set(config["text_config"])))

    def test_a_requantized_fuse_that_loses_the_adapter_fails_and_dequantize_keeps_it(self):
        """An adapter whose change is far below the 4-bit step rounds away when the fused weights are re-quantized:
        the fused model then plays like the base, and fuse must refuse it (and write nothing)."""
        base, adapter = tiny_model_in("4bit"), self.root / "adapter-4bit-small"
        write_adapter(adapter, base)
        weights = mx.load(str(adapter / "adapters.safetensors"))
        small = {k: v * 0.02 if k.endswith("lora_b") else v for k, v in weights.items()}   # dW 50x smaller
        mx.save_safetensors(str(adapter / "adapters.safetensors"), small)
        out = self.root / "fused-small"
        with self.assertRaisesRegex(Exception, "re-quantizing loses the adapter; pass --dequantize"):
            fuse.run(fuse.FuseConfig(model=base, adapter=str(adapter), out=str(out), dtype="bfloat16"))
        self.assertFalse(out.exists())
        result = fuse.run(fuse.FuseConfig(model=base, adapter=str(adapter), out=str(out), dtype="bfloat16",
                                          dequantize=True))
        self.assertEqual(result["output"], "dequantized")
        self.assertLess(result["max_abs_logit_diff"], 0.5 * result["adapter_effect"])

    def test_a_wrong_fused_weight_is_caught_before_anything_is_written(self):
        base, adapter = tiny_model_in("4bit"), self.root / "adapter-4bit"
        if not adapter.exists():
            write_adapter(adapter, base)
        out = self.root / "fused-wrong"
        real_fuse = fuse.fuse_lora_layers

        def off_by_one_step(model, dequantize=False, check=None):
            def shifted(name, lora_layer, fused_layer):    # the first layer's first group moved by one step
                if name.endswith("layers.0.self_attn.q_proj"):
                    fused_layer.biases = fused_layer.biases + mx.abs(fused_layer.scales) * 1.5
                check(name, lora_layer, fused_layer)
            return real_fuse(model, dequantize, shifted)

        fuse.fuse_lora_layers = off_by_one_step
        try:
            with self.assertRaisesRegex(Exception, "fused weight .*layers.0.self_attn.q_proj"):
                fuse.run(fuse.FuseConfig(model=base, adapter=str(adapter), out=str(out), dtype="bfloat16"))
        finally:
            fuse.fuse_lora_layers = real_fuse
        self.assertFalse(out.exists())


if __name__ == "__main__":
    unittest.main()


class DequantizedWeightTest(unittest.TestCase):
    """`fuse.dequantized_weight` makes a large weight in slices: the same array as one `mx.dequantize` call."""

    def test_slices_equal_one_call(self):
        import mlx.nn as nn
        from unittest import mock

        mx.random.seed(0)
        for module in (nn.Embedding(300, 128), nn.Linear(128, 300)):
            module.weight = module.weight.astype(mx.bfloat16)
            q = module.to_quantized(group_size=64, bits=4)
            whole = mx.dequantize(q.weight, q.scales, q.biases, 64, 4)
            for values in (1 << 24, 64 * 128, 7 * 128):      # one call, slices of 64 rows, of 7 (the last shorter)
                with self.subTest(module=type(module).__name__, values=values), \
                        mock.patch.object(fuse, "DEQUANTIZE_VALUES", values):
                    got = fuse.dequantized_weight(q)
                    self.assertEqual((got.shape, got.dtype), (whole.shape, mx.bfloat16))
                    self.assertTrue(mx.array_equal(got, whole).item())

"""The CPU speed-ups compute the same functions: the fast GELU (values and gradients against mlx-lm's
`nn.gelu_approx`, and a whole model's logits and LoRA gradients with either), and the OpenBLAS core type
chosen from CPU flags. Speed is measured in benchmarks/cpu_kernels.py, not here."""

from __future__ import annotations

import os
import unittest
from unittest import mock

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text

from wordle_mlx.blas import openblas_coretype
from wordle_mlx.llm.model import cpu_kernels, lora, models
from wordle_mlx.llm.training.sft_loss import loss_sum
from . import assert_f32_close


class FastGeluTest(unittest.TestCase):
    def test_values_and_gradients_match_gelu_approx(self):
        x = mx.concatenate([mx.linspace(-12, 12, 4001), mx.random.normal((2000,), key=mx.random.key(0)) * 3])
        exact, fast = nn.gelu_approx(x), cpu_kernels.gelu_approx_fast(x)
        self.assertLess(mx.abs(exact - fast).max().item(), 2e-6)
        weights = mx.random.normal(x.shape, key=mx.random.key(1))
        g_exact = mx.grad(lambda v: (nn.gelu_approx(v) * weights).sum())(x)
        g_fast = mx.grad(lambda v: (cpu_kernels.gelu_approx_fast(v) * weights).sum())(x)
        self.assertLess(mx.abs(g_exact - g_fast).max().item(), 2e-5)
        # far tails: gelu(x) = x for large x, 0 for very negative x, and the gradient 1 / 0
        tails = mx.array([-30.0, -9.0, 9.0, 30.0])
        np.testing.assert_allclose(np.array(cpu_kernels.gelu_approx_fast(tails)), [0, 0, 9, 30], atol=1e-6)

    def test_model_logits_and_lora_gradients_match(self):
        with mock.patch.dict(os.environ, {"WORDLE_MLX_EXACT_GELU": "1"}):
            model, _ = models.load_model("builtin:tiny-random")
        mlps = [m for _, m in model.named_modules() if isinstance(m, gemma3_text.MLP)]
        self.assertTrue(mlps and all(type(m) is gemma3_text.MLP for m in mlps))
        mx.random.seed(0)
        lora.apply_lora(model, -1, lora.lora_parameters(4, 20.0, 0.0, None))
        for _, p in tree_flatten(model.trainable_parameters()):   # lora_b starts at 0: give it values
            p[...] = mx.random.normal(p.shape) * 0.05
        inputs = mx.array(np.random.default_rng(0).integers(3, 200, size=(2, 24)).astype(np.int32))
        positions, targets = mx.arange(30, 46), mx.array(np.arange(16) + 5)
        weights = mx.ones((16,))
        step = nn.value_and_grad(model, loss_sum)

        def run():
            (s, n), g = step(model, inputs, positions, targets, weights)
            return model(inputs), s / n, dict(tree_flatten(g))

        logits_exact, loss_exact, grads_exact = run()
        names = [k for k, _ in tree_flatten(model.parameters())]
        self.assertEqual(cpu_kernels.use_fast_gelu(model), len(mlps))
        self.assertTrue(all(type(m).__name__ == "FastGeluMLP" for m in mlps))
        logits_fast, loss_fast, grads_fast = run()
        self.assertLess(mx.abs(logits_exact - logits_fast).max().item(), 1e-4)
        assert_f32_close(self, loss_exact.item(), loss_fast.item(), rtol=1e-4)   # another GELU: within its 1e-4
        for name, g in grads_exact.items():
            scale = max(mx.abs(g).max().item(), 1e-6)
            self.assertLess(mx.abs(g - grads_fast[name]).max().item() / scale, 1e-3, name)
        # the parameter tree (what adapters and checkpoints save) is unchanged
        self.assertEqual([k for k, _ in tree_flatten(model.parameters())], names)

    def test_load_model_switches_on_cpu_only_unless_asked(self):
        model, _ = models.load_model("builtin:tiny-random")
        kinds = {type(m).__name__ for _, m in model.named_modules() if isinstance(m, gemma3_text.MLP)}
        self.assertEqual(kinds, {"FastGeluMLP"} if not models.metal_available() else {"MLP"})


class CoretypeTest(unittest.TestCase):
    def test_flags_choose_the_kernel_family(self):
        avx512 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma"}
        self.assertEqual(openblas_coretype(avx512), "SkylakeX")
        self.assertEqual(openblas_coretype({"avx2", "fma", "avx"}), "Haswell")
        self.assertIsNone(openblas_coretype({"sse2", "avx"}))
        self.assertIsNone(openblas_coretype(set()))


if __name__ == "__main__":
    unittest.main()

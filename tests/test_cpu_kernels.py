"""The CPU speed-ups compute the same functions: the fast GELU (values and gradients against mlx-lm's
`nn.gelu_approx`, and a whole model's logits and LoRA gradients with either), the numpy cross-entropy (values and
gradients against `nn.losses.cross_entropy`, alone and in the `train_free` SFT loss) and the OpenBLAS core type
chosen from CPU flags, and the environment the CLI re-executes with on Linux (OpenBLAS, its core type, the malloc
tunables). Speed is measured in benchmarks/cpu_kernels.py and benchmarks/malloc_reuse.py, not here."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text

from wordle_mlx.runtime.blas import MALLOC_TUNABLES, linux_cpu_env, openblas_coretype, single_thread_numpy_blas
from wordle_mlx.runtime import device
from wordle_mlx.llm.model import cpu_kernels, lora, models, packed
from wordle_mlx.llm.training.sft_loss import loss_sum
from . import F32_RTOL, assert_f32_close


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
        self.assertEqual(kinds, {"FastGeluMLP"} if not device.has_gpu() else {"MLP"})


class CrossEntropyTest(unittest.TestCase):
    def test_values_and_gradients_match_nn_cross_entropy(self):
        hidden = mx.random.normal((37, 64), key=mx.random.key(0))
        head = mx.random.normal((5000, 64), key=mx.random.key(1)) * 0.3
        targets = mx.array(np.random.default_rng(2).integers(0, 5000, size=37).astype(np.int32))
        weights = mx.random.uniform(shape=(37,), key=mx.random.key(3))

        def loss(ce):   # through a projection, as the SFT loss uses it: the gradient reaches the hidden states
            return lambda h: (ce(h @ head.T, targets) * weights).sum()

        ref_value, ref_grad = mx.value_and_grad(loss(nn.losses.cross_entropy))(hidden)
        value, grad = mx.value_and_grad(loss(cpu_kernels.cross_entropy))(hidden)
        rows = cpu_kernels.cross_entropy(hidden @ head.T, targets)
        np.testing.assert_allclose(np.array(rows), np.array(nn.losses.cross_entropy(hidden @ head.T, targets)),
                                   rtol=1e-5, atol=1e-5)
        assert_f32_close(self, value.item(), ref_value.item(), rtol=1e-5)
        scale = mx.abs(ref_grad).max().item()
        self.assertLess(mx.abs(grad - ref_grad).max().item() / scale, 1e-5)
        # large logits: the log-sum-exp is taken after the row's maximum, so nothing overflows
        big = mx.array([[1000.0, 0.0, -1000.0], [88.0, 89.0, 90.0]])
        np.testing.assert_allclose(np.array(cpu_kernels._cross_entropy_numpy(big, mx.array([0, 2]))),   # any width
                                   np.array(nn.losses.cross_entropy(big, mx.array([0, 2]))), rtol=1e-6, atol=1e-6)

    def test_gradient_has_no_subnormals_where_logits_spread_widely(self):
        """Logits spread over 200 units, as a trained model's are: many softmax entries fall below float32's
        normal range. The gradient flushes them to 0 (none is left subnormal) and still matches the reference,
        for a loss scaled down (a mean over many tokens) and for zero-weight padding rows."""
        rng = np.random.default_rng(4)
        logits = mx.array((rng.standard_normal((12, 6000)) * 30).astype(np.float32))
        targets = mx.array(rng.integers(0, 6000, size=12).astype(np.int32))
        weights = mx.array(np.r_[np.full(10, 1e-3), 0.0, 2.0].astype(np.float32))
        tiny = np.finfo(np.float32).tiny

        def grad_of(ce):
            return mx.grad(lambda x: (ce(x, targets) * weights).sum())(logits)

        ref = np.array(grad_of(nn.losses.cross_entropy))
        self.assertGreater(int(np.sum((ref != 0) & (np.abs(ref) < tiny))), 1000)   # the reference has them
        got = np.array(grad_of(cpu_kernels._cross_entropy_numpy))
        self.assertEqual(int(np.sum((got != 0) & (np.abs(got) < tiny))), 0)
        self.assertLess(np.abs(got - ref).max() / np.abs(ref).max(), 1e-5)
        np.testing.assert_array_equal(got[10], 0.0)                                # a zero-weight row

    def test_train_free_sft_loss_matches_the_reference_path(self):
        """The `train_free` loss (words letters plus every reply token over the vocabulary) with the numpy
        cross-entropy gives the loss and LoRA gradients of mlx-lm's."""
        model, _ = models.load_model("builtin:tiny-random")
        mx.random.seed(0)
        lora.apply_lora(model, -1, lora.lora_parameters(4, 20.0, 0.0, None))
        for _, p in tree_flatten(model.trainable_parameters()):
            p[...] = mx.random.normal(p.shape) * 0.05
        rng = np.random.default_rng(0)
        inputs = mx.array(rng.integers(3, 200, size=(2, 24)).astype(np.int32))
        positions, targets = mx.arange(30, 46), mx.array(np.arange(16) + 5)
        weights = mx.ones((16,))
        step = nn.value_and_grad(model, loss_sum)
        results = {}
        for name, ce in (("reference", nn.losses.cross_entropy), ("numpy", cpu_kernels._cross_entropy_numpy)):
            with mock.patch("wordle_mlx.llm.training.sft_loss.cross_entropy", ce):
                (s, n), g = step(model, inputs, positions, targets, weights)
            results[name] = ((s / n).item(), dict(tree_flatten(g)))
        assert_f32_close(self, results["numpy"][0], results["reference"][0], rtol=1e-5)
        for name, g in results["reference"][1].items():
            scale = max(mx.abs(g).max().item(), 1e-6)
            self.assertLess(mx.abs(g - results["numpy"][1][name]).max().item() / scale, 1e-4, name)

    def test_after_the_trace_same_values_and_no_kept_graph(self):
        """Under `numpy_after_trace` (what the trainer's step uses) the numpy cross-entropy gives the eager path's
        loss and gradient bit for bit, and the forward's intermediates are freed: evaluated inside the trace they
        are all kept (the 270M's train_free step at batch 16: 10.1 GB against 2.7 GB)."""
        rng = np.random.default_rng(5)
        x = mx.array(rng.standard_normal((64, 8192)).astype(np.float32))
        targets = mx.array(rng.integers(0, 8192, size=64).astype(np.int32))
        weights = mx.array(np.r_[np.ones(60), np.zeros(4)].astype(np.float32))

        def loss(h):     # a chain of 2 MB intermediates the backward pass does not need
            for _ in range(12):
                h = h * 1.01 + 0.01
            return (cpu_kernels.cross_entropy(h, targets) * weights).sum()

        def run(after_trace: bool):
            step = mx.value_and_grad(loss)
            mx.clear_cache()
            mx.reset_peak_memory()
            with mock.patch.object(cpu_kernels, "_NUMPY_MIN_WIDTH", 0):
                if after_trace:
                    with cpu_kernels.numpy_after_trace():
                        value, grad = step(x)
                else:
                    value, grad = step(x)
            mx.eval(value, grad)
            return np.array(value), np.array(grad), mx.get_peak_memory()

        eager_value, eager_grad, eager_peak = run(False)
        value, grad, peak = run(True)
        np.testing.assert_array_equal(value, eager_value)
        np.testing.assert_array_equal(grad, eager_grad)
        np.testing.assert_array_equal(grad[60:], 0.0)                   # zero-weight rows
        self.assertLess(peak, eager_peak - 8 * x.nbytes)                # 12 intermediates kept eagerly


class ChunkAttentionTest(unittest.TestCase):
    """The packed prefill's attention in numpy gives MLX's, chunk by chunk, for several key heads (the 4B's 8
    query heads on 4) or one, the start's keys given or at the head of the stream, the sliding window on."""

    def test_matches_mlx_grouped_attention(self):
        rng = np.random.default_rng(0)
        lengths, shared, d = [1, 9, 3, 12, 5, 2], 6, 16
        seg = np.repeat(np.arange(len(lengths)), lengths)
        pos = (shared + np.arange(len(seg)) - np.repeat(np.cumsum(lengths) - lengths, lengths)).astype(np.int32)
        chunks = packed.attention_chunks(lengths, 12)
        for heads, kv_heads in ((8, 4), (4, 1)):
            for inline, window in ((False, None), (True, None), (True, 8)):
                n = len(seg) + (shared if inline else 0)
                q, k, v = (rng.standard_normal((n, h, d)).astype(np.float32) * 2
                           for h in (heads, kv_heads, kv_heads))
                sk, sv = (rng.standard_normal((shared, kv_heads, d)).astype(np.float32) for _ in range(2))
                biases = [packed._chunk_bias(seg[lo:hi], pos[lo:hi], shared, window) for lo, hi in chunks]
                ranges = chunks
                if inline:
                    ranges = [(0, shared)] + [(lo + shared, hi + shared) for lo, hi in chunks]
                    biases = [packed._chunk_bias(np.zeros(shared, int), np.arange(shared), 0, window)] + biases
                got = cpu_kernels.chunk_attention(q, k, v, 0.25, ranges, biases, None if inline else sk,
                                                  None if inline else sv, shared if inline else 0)
                mq, mk, mv = (mx.array(a).transpose(1, 0, 2)[None] for a in (q, k, v))
                want = []
                for (lo, hi), bias in zip(ranges, biases):
                    if inline:
                        before = (mk[:, :, :shared], mv[:, :, :shared]) if lo >= shared else None
                    else:
                        before = tuple(mx.array(a).transpose(1, 0, 2)[None] for a in (sk, sv))
                    kc, vc = mk[:, :, lo:hi], mv[:, :, lo:hi]
                    if before is not None:
                        kc, vc = mx.concatenate([before[0], kc], axis=2), mx.concatenate([before[1], vc], axis=2)
                    want.append(packed.grouped_attention(mq[:, :, lo:hi], kc, vc, 0.25, mx.array(bias)))
                want = np.array(mx.concatenate(want, axis=2)[0].transpose(1, 0, 2))
                self.assertEqual(got.shape, want.shape)
                # outputs are convex mixes of values of size ~2: float32 rounding of the softmax's sums
                np.testing.assert_allclose(got, want, rtol=0, atol=F32_RTOL * 64 * float(np.abs(v).max()),
                                           err_msg=f"heads {heads}/{kv_heads} inline {inline} window {window}")


class NumpyBlasTest(unittest.TestCase):
    def test_numpy_s_own_openblas_runs_on_one_thread(self):
        maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
        paths = {line.split()[-1] for line in maps.splitlines() if "scipy_openblas" in line}
        if not paths:
            self.skipTest("numpy here has no bundled OpenBLAS of its own")
        self.assertTrue(single_thread_numpy_blas())
        lib = ctypes.CDLL(sorted(paths)[0])
        name = next(n for n in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads")
                    if hasattr(lib, n))
        self.assertEqual(getattr(lib, name)(), 1)


class CoretypeTest(unittest.TestCase):
    def test_flags_choose_the_kernel_family(self):
        avx512 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma"}
        self.assertEqual(openblas_coretype(avx512), "SkylakeX")
        self.assertEqual(openblas_coretype({"avx2", "fma", "avx"}), "Haswell")
        self.assertIsNone(openblas_coretype({"sse2", "avx"}))
        self.assertIsNone(openblas_coretype(set()))


class LinuxCpuEnvTest(unittest.TestCase):
    LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"

    def test_a_fresh_process_gets_openblas_its_core_type_and_the_malloc_tunables(self):
        env = linux_cpu_env({"PATH": "/bin", "LD_PRELOAD": "libx.so"}, self.LIB, lambda: "SkylakeX")
        self.assertEqual(env["LD_PRELOAD"], f"{self.LIB}:libx.so")
        self.assertEqual(env["OPENBLAS_CORETYPE"], "SkylakeX")
        self.assertEqual(env["GLIBC_TUNABLES"], MALLOC_TUNABLES)
        self.assertEqual(env["PATH"], "/bin")
        self.assertIn("glibc.malloc.mmap_max=0", MALLOC_TUNABLES.split(":"))

    def test_what_the_user_set_is_kept(self):
        env = linux_cpu_env({"OPENBLAS_CORETYPE": "Haswell", "GLIBC_TUNABLES": ""}, self.LIB, lambda: "SkylakeX")
        self.assertEqual((env["OPENBLAS_CORETYPE"], env["GLIBC_TUNABLES"]), ("Haswell", ""))
        # OpenBLAS already preloaded: only the tunables are missing; with them set too, nothing to re-execute for
        env = linux_cpu_env({"LD_PRELOAD": self.LIB}, self.LIB, lambda: "SkylakeX")
        self.assertEqual((env["LD_PRELOAD"], env["GLIBC_TUNABLES"]), (self.LIB, MALLOC_TUNABLES))
        self.assertNotIn("OPENBLAS_CORETYPE", env)
        self.assertIsNone(linux_cpu_env({"LD_PRELOAD": self.LIB, "GLIBC_TUNABLES": "glibc.malloc.check=0"},
                                        self.LIB, lambda: "SkylakeX"))

    def test_no_openblas_still_gets_the_tunables_and_opting_out_or_the_guard_stops_it(self):
        self.assertEqual(linux_cpu_env({}, None, lambda: "SkylakeX"), {"GLIBC_TUNABLES": MALLOC_TUNABLES,
                                                              "WORDLE_MLX_BLAS_REEXECED": "1"})
        self.assertIsNone(linux_cpu_env({"WORDLE_MLX_NO_REEXEC": "1"}, self.LIB, lambda: None))
        self.assertIsNone(linux_cpu_env({"WORDLE_MLX_BLAS_REEXECED": "1"}, self.LIB, lambda: None))

    @unittest.skipUnless(platform.system() == "Linux", "the re-exec is for Linux")
    def test_a_real_process_reexecutes_with_the_tunables(self):
        env = {k: v for k, v in os.environ.items()
               if k not in ("GLIBC_TUNABLES", "WORDLE_MLX_BLAS_REEXECED", "WORDLE_MLX_NO_REEXEC")}
        code = ("from wordle_mlx.runtime.blas import reexec_for_linux_cpu\nreexec_for_linux_cpu()\n"
                "import os\nprint(os.environ['GLIBC_TUNABLES'])")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.assertEqual(out.stdout.strip(), MALLOC_TUNABLES)


if __name__ == "__main__":
    unittest.main()

"""The default dtype follows the device (`runtime/device.py`), WORDLE_MLX_DEFAULT_DTYPE overrides it, and a bad
value is a one-line error naming the variable; loading a model with no dtype follows the same decision."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx

from wordle_mlx.errors import UserError
from wordle_mlx.llm.model import models
from wordle_mlx.runtime import device

ROOT = Path(__file__).resolve().parent.parent


def env_without_override(**extra) -> dict:
    return {**{k: v for k, v in os.environ.items() if k != device.DTYPE_ENV}, **extra}


class DefaultDtypeTest(unittest.TestCase):
    def test_the_device_decides_without_the_variable(self):
        with mock.patch.dict(os.environ, env_without_override(), clear=True):
            with mock.patch.object(device, "has_gpu", return_value=True):
                self.assertEqual(device.default_dtype(), "bfloat16")
                self.assertEqual(models.check_dtype(None), "bfloat16")
            with mock.patch.object(device, "has_gpu", return_value=False):
                self.assertEqual(device.default_dtype(), "float32")
                self.assertEqual(models.check_dtype(None), "float32")
            self.assertEqual(models.check_dtype("float16"), "float16")      # a dtype given wins

    def test_the_variable_overrides_the_device(self):
        for value in device.DTYPES:
            for gpu in (True, False):
                with self.subTest(value=value, gpu=gpu), mock.patch.dict(os.environ, {device.DTYPE_ENV: value}), \
                        mock.patch.object(device, "has_gpu", return_value=gpu):
                    self.assertEqual(device.default_dtype(), value)
        with mock.patch.dict(os.environ, {device.DTYPE_ENV: ""}), mock.patch.object(device, "has_gpu",
                                                                                   return_value=False):
            self.assertEqual(device.default_dtype(), "float32")            # empty: as if unset

    def test_a_bad_value_is_one_line_naming_the_variable(self):
        with mock.patch.dict(os.environ, {device.DTYPE_ENV: "bf16"}):
            with self.assertRaises(UserError) as ctx:
                device.default_dtype()
        message = str(ctx.exception)
        self.assertIn("WORDLE_MLX_DEFAULT_DTYPE='bf16'", message)
        self.assertIn("bfloat16", message)
        self.assertNotIn("\n", message)

    def test_a_bad_value_stops_the_cli_with_one_line(self):
        proc = subprocess.run([sys.executable, "-m", "wordle_mlx", "model", "import", "builtin:tiny-random", "--out",
                               str(ROOT / "no-such-dir" / "never-written")],
                              cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env=env_without_override(**{device.DTYPE_ENV: "double"}))
        self.assertEqual(proc.returncode, 2, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        self.assertEqual(len(lines), 1, proc.stderr)
        self.assertIn("WORDLE_MLX_DEFAULT_DTYPE='double'", lines[0])
        self.assertFalse((ROOT / "no-such-dir").exists())

    def test_has_gpu_asks_mlx_for_any_gpu_backend_and_the_default_device(self):
        self.assertIsInstance(device.has_gpu(), bool)
        with mock.patch.object(mx, "is_available", return_value=False):
            self.assertFalse(device.has_gpu())
        with mock.patch.object(mx, "is_available", return_value=True), \
                mock.patch.object(mx, "default_device", return_value=mx.Device(mx.gpu)):
            self.assertTrue(device.has_gpu())
        with mock.patch.object(mx, "is_available", return_value=True), \
                mock.patch.object(mx, "default_device", return_value=mx.Device(mx.cpu)):
            self.assertFalse(device.has_gpu())                           # MLX put on the CPU: CPU defaults


class LoadFollowsTheDefaultTest(unittest.TestCase):
    """`cast_model(model, None)`: half weights go to float32 where the default is float32, else stay."""

    def test_cast_follows_the_default(self):
        model, _ = models.load_model("builtin:tiny-random", dtype="float32")
        for value, expected in (("float32", mx.float32), ("bfloat16", mx.bfloat16)):
            model.set_dtype(mx.bfloat16)
            with self.subTest(value=value), mock.patch.dict(os.environ, {device.DTYPE_ENV: value}):
                models.cast_model(model, None)
                self.assertEqual(model.model.embed_tokens.weight.dtype, expected)


if __name__ == "__main__":
    unittest.main()

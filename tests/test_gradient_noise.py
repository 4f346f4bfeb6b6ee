"""The noise-scale estimator of scripts/gradient_noise.py on gradients with a known mean and noise."""

from __future__ import annotations

import unittest

import numpy as np

from . import load_script

gradient_noise = load_script("gradient_noise")


class NoiseScaleTest(unittest.TestCase):
    def test_recovers_known_noise_scale(self):
        rng = np.random.default_rng(0)
        dim, mean = 400, 0.2                      # |mu|^2 = 400 * 0.04 = 16, tr(Sigma) = 400: B_noise = 25
        vectors = [mean + rng.normal(size=dim) for _ in range(300)]
        out = gradient_noise.noise_scale(vectors)
        self.assertAlmostEqual(out["noise_trace"], 400, delta=20)
        self.assertLess(abs(out["mean_sq_norm"] - 16), 3 * out["mean_sq_norm_se"])
        self.assertAlmostEqual(out["noise_scale"], 25, delta=5)
        self.assertLess(out["noise_scale_lower_bound"], 25)

    def test_pure_noise_has_no_estimate_but_a_bound(self):
        rng = np.random.default_rng(1)
        out = gradient_noise.noise_scale([rng.normal(size=400) for _ in range(40)])
        self.assertLess(abs(out["mean_sq_norm"]), 3 * out["mean_sq_norm_se"])
        if out["mean_sq_norm"] <= 0:
            self.assertIsNone(out["noise_scale"])
        self.assertGreater(out["noise_scale_lower_bound"], 40 / 3)   # far above what 40 units can resolve

    def test_needs_two_units(self):
        with self.assertRaises(SystemExit):
            gradient_noise.noise_scale([np.ones(3)])


if __name__ == "__main__":
    unittest.main()

"""The Metal memory setup (`llm/model/memory.py`): the limits it sets on a Mac, and that it does nothing on CPU."""

from __future__ import annotations

import unittest
from unittest import mock

import mlx.core as mx

from wordle_mlx.llm.model import memory
from wordle_mlx.runtime import device

WORKING_SET = 16_000_000_000


class MemorySetupTest(unittest.TestCase):
    def test_without_metal_nothing_is_set(self):
        with mock.patch.object(device, "has_gpu", return_value=False), \
                mock.patch.object(mx, "set_wired_limit") as wired, mock.patch.object(mx, "set_cache_limit") as cache:
            self.assertEqual(memory.configure_metal_memory(), {})
        wired.assert_not_called()
        cache.assert_not_called()
        memory.free_cache()                      # empties MLX's CPU buffer cache, no error

    def test_this_machine_without_metal_is_left_alone(self):
        if device.has_gpu():
            self.skipTest("a GPU is available here")
        self.assertEqual(memory.configure_metal_memory(), {})

    def test_on_metal_the_wired_and_cache_limits_follow_the_working_set(self):
        info = {"max_recommended_working_set_size": WORKING_SET}
        with mock.patch.object(device, "has_gpu", return_value=True), \
                mock.patch.object(mx, "device_info", return_value=info), \
                mock.patch.object(mx, "set_wired_limit") as wired, mock.patch.object(mx, "set_cache_limit") as cache:
            got = memory.configure_metal_memory()
        wired.assert_called_once_with(WORKING_SET)
        cache.assert_called_once_with(int(memory.CACHE_FRACTION * WORKING_SET))
        self.assertEqual(got, {"wired_limit_bytes": WORKING_SET,
                               "cache_limit_bytes": int(memory.CACHE_FRACTION * WORKING_SET)})

    def test_a_wired_limit_above_the_system_limit_is_skipped(self):
        info = {"max_recommended_working_set_size": WORKING_SET}
        with mock.patch.object(device, "has_gpu", return_value=True), \
                mock.patch.object(mx, "device_info", return_value=info), \
                mock.patch.object(mx, "set_wired_limit", side_effect=ValueError("above the system wired limit")), \
                mock.patch.object(mx, "set_cache_limit") as cache:
            got = memory.configure_metal_memory()
        cache.assert_called_once()
        self.assertNotIn("wired_limit_bytes", got)


if __name__ == "__main__":
    unittest.main()

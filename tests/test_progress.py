"""Plain progress lines (`progress.PlainProgress`): what a stage prints where stderr is a log, not a terminal."""

from __future__ import annotations

import io
import unittest
from unittest import mock

from rich.console import Console

from wordle_mlx.runtime import progress as progress_module
from wordle_mlx.runtime.progress import PlainProgress, clock, progress_bar


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class PlainProgressTest(unittest.TestCase):
    def make(self, total, every=5.0):
        lines, now = [], FakeClock()
        return PlainProgress("sft", total, write=lines.append, now=now, every=every), lines, now

    def test_lines_carry_the_figures_elapsed_time_and_eta(self):
        progress, lines, now = self.make(4)
        now.t += 10
        progress.advance(1, info="loss 2.310  48 tok/s")
        self.assertEqual(lines, ["sft  1/4  25%  loss 2.310  48 tok/s  elapsed 0:10  eta 0:30"])
        now.t += 20
        progress.advance(1, info="loss 2.000  50 tok/s")
        self.assertEqual(lines[-1], "sft  2/4  50%  loss 2.000  50 tok/s  elapsed 0:30  eta 0:30")

    def test_lines_are_throttled_but_the_last_is_always_printed(self):
        progress, lines, now = self.make(10, every=5.0)
        for _ in range(10):
            now.t += 1
            progress.advance(1)
        self.assertEqual([line.split("  ")[1] for line in lines], ["1/10", "6/10", "10/10"])
        self.assertNotIn("eta", lines[-1])

    def test_a_resumed_run_estimates_from_the_steps_it_runs(self):
        progress, lines, now = self.make(10)
        progress.advance(8)                        # steps 1-8 were done before the resume
        now.t += 60
        progress.advance(1, info="reward 0.5")
        self.assertEqual(lines[-1], "sft  9/10  90%  reward 0.5  elapsed 1:00  eta 1:00")

    def test_a_log_gets_plain_lines_not_a_bar(self):
        """Where stderr is not a terminal (a recipe's log), progress_bar prints PlainProgress lines, no escapes."""
        log = io.StringIO()
        with mock.patch.object(progress_module, "console", Console(file=log)):
            with progress_bar("sft", 2) as advance:
                advance(1, info="loss 2.310")
                advance(1)
        lines = log.getvalue().splitlines()
        self.assertEqual([line.split("  elapsed")[0] for line in lines],
                         ["sft  1/2  50%  loss 2.310", "sft  2/2  100%  loss 2.310"])
        self.assertNotIn("\x1b", log.getvalue())

    def test_clock(self):
        self.assertEqual([clock(41), clock(723), clock(3723)], ["0:41", "12:03", "1:02:03"])


if __name__ == "__main__":
    unittest.main()

"""`StopSignals`: the first SIGINT/SIGTERM is recorded, not fatal; a second Ctrl-C raises; handlers are restored.

The training stages' use of it (stop after the step, checkpoint there, exit 143, exact resume) is tested
end to end in tests/test_faults.py (`StopSignalThenResume`).
"""

from __future__ import annotations

import os
import signal
import threading
import unittest
from types import SimpleNamespace

from wordle_mlx.runtime.stop_signals import EXIT_CODES, StopSignals, agreed_stop


class StopSignalsTest(unittest.TestCase):
    def test_first_signal_is_recorded_and_handlers_restored(self):
        before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        with StopSignals(announce=False) as stop:
            self.assertIsNone(stop.received)
            os.kill(os.getpid(), signal.SIGTERM)          # would end the process without the handler
            self.assertEqual(stop.received, "SIGTERM")
            os.kill(os.getpid(), signal.SIGTERM)          # a second SIGTERM keeps the first record
            self.assertEqual(stop.received, "SIGTERM")
        self.assertEqual((signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)), before)

    def test_second_ctrl_c_raises_at_once(self):
        # Python's own Ctrl-C handler, as in a terminal: a suite started as a background job (`make test &`)
        # inherits SIGINT ignored, which StopSignals rightly keeps (the next test).
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with self.assertRaises(KeyboardInterrupt):
                with StopSignals(announce=False) as stop:
                    os.kill(os.getpid(), signal.SIGINT)
                    self.assertEqual(stop.received, "SIGINT")
                    os.kill(os.getpid(), signal.SIGINT)
                    self.fail("the second SIGINT did not raise")
            self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
        finally:
            signal.signal(signal.SIGINT, previous)

    def test_an_ignored_signal_stays_ignored(self):
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)     # as a shell starts a background job
        try:
            with StopSignals(announce=False) as stop:
                self.assertIs(signal.getsignal(signal.SIGINT), signal.SIG_IGN)
                os.kill(os.getpid(), signal.SIGINT)
                self.assertIsNone(stop.received)
            self.assertIs(signal.getsignal(signal.SIGINT), signal.SIG_IGN)
        finally:
            signal.signal(signal.SIGINT, previous)

    def test_outside_the_main_thread_nothing_is_installed(self):
        seen = {}

        def body():
            with StopSignals(announce=False) as stop:
                seen["previous"] = dict(stop._previous)
        worker = threading.Thread(target=body)
        worker.start()
        worker.join()
        self.assertEqual(seen["previous"], {})

    def test_every_rank_stops_when_any_rank_was_signalled(self):
        stop = StopSignals(announce=False)
        self.assertIsNone(agreed_stop(stop, SimpleNamespace(size=1)))
        stop.received = "SIGINT"
        self.assertEqual(agreed_stop(stop, SimpleNamespace(size=1)), "SIGINT")
        stop.received = None           # this rank saw nothing; another saw SIGTERM (code 2)
        two_ranks = SimpleNamespace(size=2, max_floats=lambda values, what: [max(values[0], 2.0)])
        self.assertEqual(agreed_stop(stop, two_ranks), "SIGTERM")
        quiet = SimpleNamespace(size=2, max_floats=lambda values, what: list(values))
        self.assertIsNone(agreed_stop(stop, quiet))
        self.assertEqual(EXIT_CODES, {"SIGINT": 130, "SIGTERM": 143})


if __name__ == "__main__":
    unittest.main()

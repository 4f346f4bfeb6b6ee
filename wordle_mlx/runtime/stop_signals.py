"""Stop a training run cleanly on Ctrl-C or SIGTERM (a shutdown, a closed session, `kill`).

`StopSignals` is a context manager around a training loop. The first SIGINT or SIGTERM only records its
name; the loop checks `received` after each finished step, saves a checkpoint there and returns with
`stopped` set to "SIGINT" or "SIGTERM". A second Ctrl-C raises `KeyboardInterrupt` at once (the stages
then drop the unfinished step). The CLI turns a stopped run into exit code 130 (SIGINT) or 143 (SIGTERM),
so `wordle-mlx recipe` (`make train-270m`) never marks a stopped stage as done. Without it, SIGTERM
killed the process between checkpoints. A signal the process inherited as ignored stays ignored (a shell
starts background jobs with SIGINT ignored: stop those with SIGTERM). Handlers are installed only in the
main thread (Python allows no other) and restored on exit.
"""

from __future__ import annotations

import signal
import sys
import threading

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}   # 128 + the signal number, as a shell reports it


class StopSignals:
    """Record the first SIGINT/SIGTERM instead of dying; `received` is its name, or None."""

    def __init__(self, announce: bool = True):
        self.received: str | None = None
        self.announce = announce
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt          # a second Ctrl-C: stop now
        if self.received is None:
            self.received = name
            if self.announce:
                print(f"{name}: stopping after this step with a checkpoint (Ctrl-C again to stop now)",
                      file=sys.stderr, flush=True)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:     # an ignored signal stays ignored
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def agreed_stop(stop: StopSignals, world) -> str | None:
    """The stop signal if any rank received one (every rank must leave the loop at the same step)."""
    if world.size == 1:
        return stop.received
    code = {None: 0.0, "SIGINT": 1.0, "SIGTERM": 2.0}[stop.received]
    got = world.max_floats([code], "all_max of stop requests")[0]
    return {0.0: None, 1.0: "SIGINT", 2.0: "SIGTERM"}[got]

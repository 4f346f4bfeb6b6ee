"""Run the unittest suite and end with one line: `N passed, N failed, N skipped`.

unittest prints no such line by itself, and CI reads it. Errors count as failures. On Linux the
process first re-executes itself with OpenBLAS preloaded (see wordle_mlx/runtime/blas.py), as the CLI does.
Usage: python scripts/run_tests.py [-k PATTERN] [test modules or dotted names ...]
"""

from __future__ import annotations

import argparse
import sys
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wordle_mlx.runtime.blas import reexec_for_linux_cpu  # noqa: E402


class CountingResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passed = 0

        self.module_seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def stopTest(self, test):
        """Seconds since the previous test ended, set-up of its class and module included, per module."""
        super().stopTest(test)
        now = time.perf_counter()
        module = type(test).__module__
        self.module_seconds[module] = self.module_seconds.get(module, 0.0) + now - self._last
        self._last = now

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed += 1


def main() -> int:
    reexec_for_linux_cpu()
    parser = argparse.ArgumentParser()
    parser.add_argument("-k", dest="patterns", action="append", default=None)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()

    loader = unittest.TestLoader()
    if args.patterns:
        loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in args.patterns]
    if args.names:
        suite = loader.loadTestsFromNames(args.names)
    else:
        suite = loader.discover(str(ROOT / "tests"), top_level_dir=str(ROOT))
    runner = unittest.TextTestRunner(
        verbosity=2 if args.verbose else 1, resultclass=CountingResult, stream=sys.stdout
    )
    start = time.time()
    result = runner.run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    slowest = sorted(result.module_seconds.items(), key=lambda kv: -kv[1])[:5]
    print(f"({time.time() - start:.1f}s; slowest modules: "
          + ", ".join(f"{name.removeprefix('tests.')} {sec:.0f}s" for name, sec in slowest) + ")")
    print(f"{result.passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or result.testsRun == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The Python that `make setup` builds .venv with: one that the pinned packages accept (3.11 or later).

    python3 scripts/find_python.py [--python PYTHON] [--venv DIR]      (make check-python)

Prints the chosen interpreter on stdout and exits 0, or prints one line on stderr that names the version it
found, the versions needed and how to get one, and exits 1. In order:
- with --venv DIR, when DIR/bin/python exists: that one, if it is recent enough (setup reuses the venv);
- --python (make's PYTHON) when given: that one, or the line;
- else the newest python3.N (N >= 11) on PATH that runs, 3.11-3.13 (the ones the suite and the pins' wheels
  cover) before newer ones, then python3 if it is 3.11 or later. Choosing one other than python3 is said on
  stderr.
Each candidate is probed with `--version`; one that fails (a pyenv shim of a version not selected exits 127) is
skipped. It runs on Python 3.6 and later (no f-strings, walrus or `capture_output`), so that any python3 can run
it, macOS's 3.9 included.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

NEED = (3, 11)         # mlx-lm 0.32.2's Requires-Python (mlx 0.32.4 needs 3.10); pyproject.toml says the same
TESTED = (3, 13)       # the newest version preferred when several are on PATH
HOW = "install one (brew install python@3.12, or python.org) and run: make setup PYTHON=/path/to/python3.12"


def probe(command):
    """(major, minor, micro) that `command --version` reports, or None when it does not run."""
    try:
        out = subprocess.run([command, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"Python (\d+)\.(\d+)(?:\.(\d+))?", out.stdout.strip())
    if out.returncode != 0 or not match:
        return None
    return tuple(int(part or 0) for part in match.groups())


def dotted(version):
    return ".".join(str(part) for part in version)


def on_path(path):
    """Every python3.N (N >= 11) on PATH as (minor, full path), in PATH order."""
    found = []
    for folder in path.split(os.pathsep):
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for name in names:
            match = re.match(r"python3\.(\d+)$", name)
            full = os.path.join(folder, name)
            if match and int(match.group(1)) >= NEED[1] and os.access(full, os.X_OK):
                found.append((int(match.group(1)), full))
    return found


def newest(found):
    """The candidates in the order to try: 3.11-3.13 newest first, then newer ones, oldest of those first."""
    def rank(item):
        minor = item[0]
        return (0, -minor) if minor <= TESTED[1] else (1, minor)
    return sorted(found, key=rank)   # stable: PATH order within one version


def choose(given, path):
    """(command, note) or (None, the one-line error)."""
    need = "Python {}.{} or later".format(*NEED)
    if given:
        version = probe(given)
        if version is None:
            return None, "make setup needs {}; PYTHON={} does not run: {}".format(need, given, HOW)
        if version[:2] < NEED:
            return None, "make setup needs {} (the pinned mlx-lm requires it); PYTHON={} is Python {}: {}".format(
                need, given, dotted(version), HOW)
        return given, None
    for _minor, command in newest(on_path(path)):
        version = probe(command)
        if version is not None and version[:2] >= NEED:
            return command, "make setup: using {} (Python {})".format(command, dotted(version))
    python3 = shutil.which("python3", path=path)
    version = probe(python3) if python3 else None
    if version is not None and version[:2] >= NEED:
        return "python3", None
    found = "python3 is Python {}".format(dotted(version)) if version else "no python3 runs"
    return None, "make setup needs {} (the pinned mlx-lm requires it); {} and no python3.11 or newer is on PATH: " \
                 "{}".format(need, found, HOW)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default="", help="the Python the user gave (make PYTHON=...)")
    parser.add_argument("--venv", default="", help="a venv folder that setup reuses when it exists")
    args = parser.parse_args()
    if args.venv and os.path.exists(os.path.join(args.venv, "bin", "python")):
        python = os.path.join(args.venv, "bin", "python")
        version = probe(python)
        if version is not None and version[:2] >= NEED:
            print(python)
            return 0
        what = "Python {}".format(dotted(version)) if version else "a Python that does not run"
        print("make setup needs Python {}.{} or later; {} holds {}: remove it (make clean-venv) and run make setup "
              "again".format(NEED[0], NEED[1], args.venv, what), file=sys.stderr)
        return 1
    command, note = choose(args.python.strip(), os.environ.get("PATH", ""))
    if note:
        print(note, file=sys.stderr)
    if command is None:
        return 1
    print(command)
    return 0


if __name__ == "__main__":
    sys.exit(main())

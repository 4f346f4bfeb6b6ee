"""Print constraints.txt: the package versions of the venv the test suite passed in, which `make setup` installs.

    make constraints        (.venv/bin/python scripts/freeze_constraints.py > constraints.txt)

It is `pip freeze` of this venv less three kinds of line: the project itself (an editable install), packages
installed from a file or a URL rather than from PyPI, and `mlx-cpu`, which `mlx[cpu]` pins on Linux and a Mac
never installs (its mlx wheel carries Metal). The Linux venv's list then also serves a Mac: pip's resolver for
macOS arm64 found a wheel of every version in it for Python 3.11 to 3.14 (llama-cpp-python aside, which builds
from source), and pip takes a constraint on a package that nothing asks for as harmless.
"""

from __future__ import annotations

import platform
import subprocess
import sys

HEADER = ("# Made by `make constraints` (scripts/freeze_constraints.py): pip freeze of the .venv that passed\n"
          "# `make test` (Python {python}, {system} {machine}), less the project itself, file or URL installs and\n"
          "# mlx-cpu. `make setup` and `make test` install with `pip install -c constraints.txt`.\n")
LEFT_OUT = {"mlx-cpu"}   # Linux only: mlx[cpu]==X pins it; a Mac's mlx wheel carries Metal itself


def constraint_lines(freeze: str) -> list[str]:
    """The `name==version` lines of a `pip freeze` output that a constraints file may carry."""
    lines = []
    for line in freeze.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e ", "--")) or " @ " in line or "==" not in line:
            continue
        name = line.split("==", 1)[0].lower().replace("_", "-").replace(".", "-")
        if name not in LEFT_OUT:
            lines.append(line)
    return sorted(lines, key=str.lower)


def main() -> int:
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], check=True,
                            capture_output=True, text=True).stdout
    sys.stdout.write(HEADER.format(python=platform.python_version(), system=platform.system(),
                                   machine=platform.machine()))
    sys.stdout.write("".join(line + "\n" for line in constraint_lines(freeze)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

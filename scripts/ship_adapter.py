"""The ship stage of `wordle-mlx recipe` (`make train-270m`): the guard, then the package of the adapter the
recipe trained, in `adapters/<model>-wordle/` (wordle_mlx/stages/recipe_ship.py; the guard's rule:
wordle_mlx/stages/recipe_guard.py).

The recipe runs it as its last 270M stage, on the config it writes for it:

    python scripts/ship_adapter.py --config logs/recipe-270m/configs/ship.json

Run by hand on that file, it ships again what the run trained (for example after deleting the adapter in the
tree, which the guard would otherwise compare with). When the guard keeps the adapter in the tree it says why
in one line per setting and exits 0, leaving the folder as it was; bad input is one line and exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wordle_mlx.stages.recipe_ship import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

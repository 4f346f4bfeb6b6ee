"""Atomic file writes and the user cache folder.

Nothing is ever left half-written: every writer here writes to a temporary file in the same folder,
flushes and fsyncs it, then renames it over the target (rename is atomic on POSIX). The cache folder
is `$WORDLE_MLX_CACHE`, else `$XDG_CACHE_HOME/wordle-mlx`, else `~/.cache/wordle-mlx`.
`remove_tree` deletes a folder by renaming it aside first, so a crash never leaves half of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def cache_dir(*parts: str) -> Path:
    base = os.environ.get("WORDLE_MLX_CACHE")
    if base is None:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "wordle-mlx")
    path = Path(base, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path beside `target`; on success rename it over `target`, on failure delete it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix or target.suffix + ".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def write_text_atomic(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def write_json_atomic(target: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(target, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def remove_tree(path: str | os.PathLike) -> None:
    """Delete a folder so that a crash midway leaves it whole or gone: rename it aside, then delete."""
    path = Path(path)
    trash = path.with_name(f".{path.name}.deleting.{os.getpid()}.{time.time_ns()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def publish_dir(tmp: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename the finished folder `tmp` to `target`, replacing an older `target` (swapped aside, then deleted)."""
    tmp, target = Path(tmp), Path(target)
    if target.exists():
        old = target.with_name(f".{target.name}.old.{os.getpid()}.{time.time_ns()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)

"""Data parallelism over `mx.distributed`: which share of a batch this rank takes, and the collectives.

`World` wraps the process group `mlx.launch` sets up (a group of one when the program is started
normally, in which case every method is a cheap no-op). `shard(items)` is this rank's share of a global
list: items rank, rank + size, ... so that the union over ranks is exactly the global list. `sum_tree`
all-reduces a tree of arrays (gradient *sums*, not means: the trainers divide once by the global token
count, so the result equals the one-process gradient on the whole batch) with one `all_sum` per dtype;
`broadcast_tree` makes every rank hold rank 0's arrays (an all_sum to which other ranks add zeros);
`sum_floats`/`max_floats` reduce a few numbers in float64; `gather_json` collects one JSON-able object
per rank (encoded as bytes and `all_gather`ed). Every collective runs under a watchdog: if it has not
finished after `WORDLE_MLX_COLLECTIVE_TIMEOUT` seconds (default 3600; 0 = off) the process prints which
collective stalled and exits with code 3, and `mlx.launch` then stops the other ranks; a lost peer
connection (the ring backend raises RuntimeError) becomes a `DistributedError` naming this rank.
`write_weights_hash` records a SHA-256 of a rank's LoRA weights when WORDLE_MLX_WEIGHTS_HASH_DIR is set
(used by tests/test_distributed.py to check that every rank ends with bitwise the same adapters).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from ...errors import UserError
from ...storage.fileio import write_text_atomic

TIMEOUT_ENV = "WORDLE_MLX_COLLECTIVE_TIMEOUT"
HASH_DIR_ENV = "WORDLE_MLX_WEIGHTS_HASH_DIR"
STALLED_EXIT_CODE = 3


class DistributedError(UserError):
    """A collective failed: another rank died or the connection between ranks broke."""


class World:
    """This process's place in the data-parallel group (rank, size) and the collectives the trainers use."""

    def __init__(self, group=None, timeout: float | None = None):
        self.group = group
        self.rank = group.rank() if group is not None else 0
        self.size = group.size() if group is not None else 1
        self.timeout = float(os.environ.get(TIMEOUT_ENV, "3600")) if timeout is None else timeout

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list) -> list:
        """Items rank, rank + size, ... of a global list."""
        return list(items[self.rank::self.size])

    def check_divisible(self, value: int, field: str) -> None:
        if value % self.size:
            raise UserError(f"{field} = {value} must be divisible by the number of ranks ({self.size}): "
                            f"every rank takes an equal share of the global batch")

    def _run(self, what: str, fn):
        """Evaluate the collective `fn()` under the watchdog; a broken connection becomes a DistributedError."""
        timer = None
        if self.timeout > 0:
            timer = threading.Timer(self.timeout, _stalled, args=(self.rank, what, self.timeout))
            timer.daemon = True
            timer.start()
        try:
            out = fn()
            mx.eval(out)
            return out
        except RuntimeError as exc:
            raise DistributedError(f"rank {self.rank}/{self.size}: {what} failed ({exc}); another rank "
                                   f"probably stopped, see its message above") from None
        finally:
            if timer is not None:
                timer.cancel()

    def sum_tree(self, tree, what: str = "gradient all_sum"):
        """Element-wise sum over ranks of a tree of arrays (same structure on every rank)."""
        if self.size == 1:
            return tree
        flat = tree_flatten(tree)
        out = dict(flat)
        by_dtype: dict = {}
        for key, value in flat:
            by_dtype.setdefault(value.dtype, []).append(key)
        for keys in by_dtype.values():
            sizes = [out[k].size for k in keys]
            joined = mx.concatenate([out[k].reshape(-1) for k in keys])
            total = self._run(what, lambda: mx.distributed.all_sum(joined, group=self.group))
            parts = mx.split(total, list(np.cumsum(sizes)[:-1])) if len(keys) > 1 else [total]
            for k, part in zip(keys, parts):
                out[k] = part.reshape(out[k].shape)
        return tree_unflatten([(k, out[k]) for k, _ in flat])

    def broadcast_tree(self, tree, what: str = "weight broadcast"):
        """Rank 0's arrays on every rank (other ranks contribute zeros to an all_sum)."""
        if self.size == 1:
            return tree
        mine = tree if self.is_main else tree_map(mx.zeros_like, tree)
        return self.sum_tree(mine, what)

    def _reduce_floats(self, values, op, what: str) -> list[float]:
        if self.size == 1:
            return [float(v) for v in values]
        arr = mx.array(np.asarray(values, dtype=np.float64))
        return [float(v) for v in np.array(self._run(what, lambda: op(arr, group=self.group, stream=mx.cpu)))]

    def sum_floats(self, values, what: str = "all_sum of step statistics") -> list[float]:
        return self._reduce_floats(values, mx.distributed.all_sum, what)

    def max_floats(self, values, what: str = "all_max of step statistics") -> list[float]:
        return self._reduce_floats(values, mx.distributed.all_max, what)

    def gather_json(self, obj, what: str = "all_gather of step results") -> list:
        """One JSON-able object per rank, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
        lengths = [int(n) for n in self.max_floats([len(data) if r == self.rank else 0 for r in range(self.size)],
                                                   what)]
        padded = np.zeros(max(lengths), dtype=np.uint8)
        padded[:len(data)] = data
        allg = np.array(self._run(what, lambda: mx.distributed.all_gather(mx.array(padded), group=self.group,
                                                                           stream=mx.cpu)))
        width = max(lengths)
        return [json.loads(allg[r * width: r * width + n].tobytes().decode()) for r, n in enumerate(lengths)]

    def broadcast_json(self, obj, what: str = "broadcast of run state"):
        """Rank 0's object on every rank."""
        return self.gather_json(obj if self.is_main else None, what)[0]

    def barrier(self, what: str = "barrier") -> None:
        self.sum_floats([0.0], what)

    def broadcast_training_state(self, model, optimizer=None) -> None:
        """Give every rank rank 0's trainable weights (and optimizer state): identical starting points."""
        if self.size == 1:
            return
        weights = self.broadcast_tree(model.trainable_parameters())
        model.load_weights(tree_flatten(weights), strict=False)
        if optimizer is not None and optimizer.state:
            for key, value in tree_flatten(self.broadcast_tree(optimizer.state, "optimizer state broadcast")):
                _set_leaf(optimizer.state, key.split("."), value)
        mx.eval(model.parameters(), optimizer.state if optimizer is not None else [])


def _set_leaf(tree, path: list[str], value) -> None:
    for key in path[:-1]:
        tree = tree[int(key)] if isinstance(tree, list) else tree[key]
    if isinstance(tree, list):
        tree[int(path[-1])] = value
    else:
        tree[path[-1]] = value


class NullWriter:
    """Stands in for the metrics writer on ranks other than 0 (only rank 0 writes files or reports).

    Takes MetricsWriter's arguments (path, report_to, run_name) and ignores them, so either can be built alike.
    """

    def __init__(self, *args, **kwargs):
        pass

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "NullWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stalled(rank: int, what: str, timeout: float) -> None:
    print(f"error: rank {rank}: {what} did not finish within {timeout:.0f} s (another rank is stuck or gone; "
          f"set {TIMEOUT_ENV} to wait longer); exiting", file=sys.stderr, flush=True)
    os._exit(STALLED_EXIT_CODE)


def init_world() -> World:
    """The group `mlx.launch` created (any backend), or a group of one."""
    if not mx.distributed.is_available():
        return World()
    group = mx.distributed.init()
    return World(group) if group.size() > 1 else World()


def check_world_size(saved_state: dict, world: World, where: str) -> None:
    """Resume only with the number of ranks the run was started with (the data split depends on it)."""
    saved = int(saved_state.get("world_size", 1))
    if saved != world.size:
        raise UserError(f"{where}: this run was trained with {saved} rank(s) but is resumed with {world.size}; "
                        f"resume with the same number of ranks (mlx.launch -n {saved} ...)")


def weights_hash(model) -> str:
    """SHA-256 over the names, shapes, dtypes and bytes of the trainable (LoRA) weights."""
    return arrays_hash(dict(tree_flatten(model.trainable_parameters())))


def arrays_hash(arrays: dict) -> str:
    """SHA-256 of named arrays (e.g. `mx.load` of an adapters.safetensors), independent of their order."""
    h = hashlib.sha256()
    for name, value in sorted(arrays.items()):
        arr = np.array(value.astype(mx.float32)) if value.dtype == mx.bfloat16 else np.array(value)
        h.update(f"{name}:{arr.shape}:{arr.dtype}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def write_weights_hash(model, world: World, stage: str) -> None:
    """When WORDLE_MLX_WEIGHTS_HASH_DIR is set: write <dir>/<stage>-rank<r>.sha256 (a test hook)."""
    folder = os.environ.get(HASH_DIR_ENV)
    if not folder:
        return

    Path(folder).mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(folder) / f"{stage}-rank{world.rank}.sha256", weights_hash(model) + "\n")

"""A faster tanh-approximate GELU, a faster cross-entropy and the packed prefill's attention for Gemma 3 on the MLX
CPU backend, numerically the same functions.

Gemma 3's MLP computes `down(gelu_approx(gate(x)) * up(x))`. On the CPU backend MLX evaluates `tanh` one element at
a time through libm, so for a small model like the 270M the GELU, and more so its gradient, costs as much as the
matmuls around it. `gelu_approx_fast` computes the same formula, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
with tanh as the clamped rational (13/6) polynomial that Eigen uses for float32 (within 4e-7 of libm's tanh), so it
is built from multiply-adds and one division that `mx.compile` fuses; its gradient is written out by hand as a
custom VJP in the same way (`benchmarks/cpu_kernels.py` compares both with `nn.gelu_approx`).
`use_fast_gelu(model)` swaps the MLP class of every Gemma 3 block of one loaded model for a subclass that calls it;
the module tree, parameter names and saved weights are unchanged. Only for CPU: on Metal `tanh` is fast already.
The same holds for `exp`: MLX's CPU backend on x86 evaluates it one element at a time, about 15x slower than
numpy's vectorised `exp`, so a cross-entropy over Gemma's 262k-entry vocabulary (SFT's full loss, `train_free`)
spends most of its step in the softmax. `cross_entropy(logits, targets)` is `nn.losses.cross_entropy` per row;
on the CPU device it computes the log-sum-exp and its gradient (softmax minus the one-hot target) in numpy as a
custom function, on row blocks in parallel threads (`benchmarks/cpu_kernels.py`: 3.5x faster for 208 rows of 262k
logits, value and gradient; the matmuls around it stay in MLX). Narrow rows (the grammar loss's 26 letters) stay in
MLX, where the numpy round trip would cost more than it saves. Its gradient flushes softmax entries too small to
matter to 0: a trained model's logits spread so widely that many would be subnormal, which slows the matmul that
carries the gradient back through the head (a `train_free` step 1.34x faster). The trainer's step runs it inside
`numpy_after_trace()`, so that numpy reads the logits after the gradient's trace, not during it (which kept every
intermediate of the forward pass alive: 10.1 GB against 2.7 GB for the 270M's step at batch 16).
`chunk_attention` is the packed prefill's attention for inference in float32 (`packed.packed_prefill`): a chunk of
a few boards' tokens is a few numpy calls, where MLX dispatches a dozen small ops and runs exp one element at a
time (a 64-board grammar call 2.6 against 2.8 s), with numpy's own BLAS on one thread
(`runtime.blas.single_thread_numpy_blas`).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import gemma3_text

from ...runtime import device
from ...runtime.blas import single_thread_numpy_blas

_TANH_CLAMP = 7.90531110763549805   # beyond this, float32 tanh is +-1
_TANH_P = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05, 5.12229709037114e-08,
           -8.60467152213735e-11, 2.00018790482477e-13, -2.76076847742355e-16)   # odd numerator, by z^2
_TANH_Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)
_C = math.sqrt(2.0 / math.pi)
_K = 0.044715


def _tanh(z: mx.array) -> mx.array:
    zc = mx.clip(z, -_TANH_CLAMP, _TANH_CLAMP)
    z2 = zc * zc
    p = _TANH_P[-1]
    for c in _TANH_P[-2::-1]:
        p = p * z2 + c
    q = _TANH_Q[-1]
    for c in _TANH_Q[-2::-1]:
        q = q * z2 + c
    # the rational is 1 - 1.2e-7 at the clamp; float32 tanh is exactly +-1 out there, so GELU's tails are x and 0
    return mx.where(mx.abs(z) >= _TANH_CLAMP, mx.sign(z), zc * p / q)


@mx.compile
def _gelu_forward(x: mx.array) -> mx.array:
    return 0.5 * x * (1.0 + _tanh(_C * (x + _K * x * x * x)))


@mx.compile
def _gelu_backward(x: mx.array, cotangent: mx.array) -> mx.array:
    x2 = x * x
    t = _tanh(_C * (x + _K * x2 * x))
    return cotangent * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _C * (1.0 + 3.0 * _K * x2))


@mx.custom_function
def gelu_approx_fast(x: mx.array) -> mx.array:
    """`nn.gelu_approx(x)`, computed without libm's tanh (see the module docstring)."""
    return _gelu_forward(x)


@gelu_approx_fast.vjp
def _gelu_approx_fast_vjp(primals, cotangent, output):
    x = primals[0] if isinstance(primals, (tuple, list)) else primals
    return (_gelu_backward(x, cotangent),)


def _fast_mlp_class(base: type) -> type:
    """A subclass of mlx-lm's Gemma 3 MLP whose call uses `gelu_approx_fast` (same parameters)."""
    class FastGeluMLP(base):
        def __call__(self, x):
            return self.down_proj(gelu_approx_fast(self.gate_proj(x)) * self.up_proj(x))

    FastGeluMLP.__name__ = FastGeluMLP.__qualname__ = f"FastGelu{base.__name__}"
    return FastGeluMLP


_FAST_CLASSES: dict[type, type] = {}


def use_fast_gelu(model) -> int:
    """Switch every Gemma 3 MLP in `model` to the fast GELU; returns how many were switched."""
    switched = 0
    for _, module in model.named_modules():
        if type(module) is gemma3_text.MLP:
            cls = _FAST_CLASSES.setdefault(gemma3_text.MLP, _fast_mlp_class(gemma3_text.MLP))
            module.__class__ = cls
            switched += 1
    return switched


def mlp_gelu(mlp):
    """The GELU a Gemma 3 MLP calls: `gelu_approx_fast` once `use_fast_gelu` switched it, else mlx-lm's."""
    return gelu_approx_fast if type(mlp) in _FAST_CLASSES.values() else nn.gelu_approx


def numpy_inference(x: mx.array) -> bool:
    """Whether inference on `x` runs the numpy kernels here: on the CPU device, in float32."""
    return not device.has_gpu() and x.dtype == mx.float32


_GELU_ROWS = 32             # rows a numpy pass works on at once (a few of 2048 floats: they stay in the core's cache)


def gated_gelu(mlp, gate: mx.array, up: mx.array, inference: bool = False) -> mx.array:
    """`gelu(gate) * up` with the GELU `mlp` calls (`mlp_gelu`), the product Gemma 3's MLP feeds its down
    projection. For inference on the CPU device in float32 it is evaluated here and computed by numpy, whose tanh
    is vectorised (MLX's compiled kernel runs one element at a time: 12 ms against 4 ms for 1,314 x 2,048 on an
    AVX-512 host), as 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) u on blocks of rows; the same function to
    float32 rounding. Never under a gradient (`inference` says so: it evaluates its inputs)."""
    if not (inference and numpy_inference(gate) and numpy_inference(up)):
        return mlp_gelu(mlp)(gate) * up
    mx.eval(gate, up)
    x, u = np.asarray(gate).reshape(-1, gate.shape[-1]), np.asarray(up).reshape(-1, up.shape[-1])
    out = np.empty_like(x)
    for a in range(0, x.shape[0], _GELU_ROWS):
        xs, t = x[a:a + _GELU_ROWS], out[a:a + _GELU_ROWS]
        np.multiply(xs, xs, out=t)
        t *= np.float32(_C * _K)
        t += np.float32(_C)
        t *= xs
        np.tanh(t, out=t)
        t += np.float32(1.0)
        t *= xs
        t *= u[a:a + _GELU_ROWS]
        t *= np.float32(0.5)
    return mx.array(out).reshape(gate.shape)


def chunk_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, chunks, biases,
                    start_k: np.ndarray | None, start_v: np.ndarray | None, start: int = 0) -> np.ndarray:
    """Attention over a packed stream in numpy (`packed.packed_prefill` on the CPU): q (N, heads, d), k and v
    (N, kv heads, d), float32. Each chunk's queries (lo, hi) attend, under its additive bias (n, keys), to the
    start's keys and values (`start_k`/`start_v`, (S, kv heads, d)) or, for chunks past them, the stream's first
    `start` tokens', then to the chunk's own; the heads that share a key head are the rows of one product. MLX's
    CPU backend makes each of a chunk's dozen small ops a dispatch and its softmax's exp a scalar loop; here a
    chunk costs a few microseconds of numpy calls. Returns (N, heads, d)."""
    single_thread_numpy_blas()
    n, heads, d = q.shape
    kv_heads = k.shape[1]
    r = heads // kv_heads
    out = np.empty_like(q)
    for (lo, hi), bias in zip(chunks, biases):
        m = hi - lo
        for g in range(kv_heads):
            kc, vc = k[lo:hi, g], v[lo:hi, g]
            if start_k is not None or (start and lo >= start):
                sk, sv = (start_k[:, g], start_v[:, g]) if start_k is not None else (k[:start, g], v[:start, g])
                kc, vc = np.concatenate([sk, kc]), np.concatenate([sv, vc])
            rows = (q[lo:hi, g * r:(g + 1) * r] * np.float32(scale)).reshape(m * r, d)
            s = (rows @ kc.T).reshape(m, r, -1)
            s += bias[:, None, :]
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            out[lo:hi, g * r:(g + 1) * r] = (s.reshape(m * r, -1) @ vc).reshape(m, r, d)
    return out


_THREADS = min(os.cpu_count() or 1, 8)
_POOL = ThreadPoolExecutor(max_workers=_THREADS)
_NUMPY_MIN_WIDTH = 4096     # logits narrower than this stay in MLX
_FLUSH = 2.0 ** -100        # the gradient's softmax entries below _FLUSH / |cotangent| become 0 (normal floor 2^-126)


def _by_rows(fn, n: int) -> None:
    """Run fn(start, stop) over row blocks of n rows on the pool's threads (numpy releases the GIL)."""
    blocks = np.linspace(0, n, min(_THREADS, max(n, 1)) + 1).astype(int)
    list(_POOL.map(fn, blocks[:-1], blocks[1:]))


def _loss_rows(y: np.ndarray, t: np.ndarray, out: np.ndarray, scratch: np.ndarray | None = None) -> None:
    """out[i] = log-sum-exp(y[i]) - y[i, t[i]]; `scratch` (y's shape) holds the exponentials when given."""
    def rows(a: int, b: int) -> None:
        top = y[a:b].max(axis=-1, keepdims=True)
        shifted = np.subtract(y[a:b], top, out=None if scratch is None else scratch[a:b])
        np.exp(shifted, out=shifted)
        # log-sum-exp minus the target's logit, the maximum cancelled exactly (top - target, not lse - target)
        out[a:b] = np.log(shifted.sum(axis=-1)) + (top[:, 0] - y[np.arange(a, b), t[a:b]])

    _by_rows(rows, y.shape[0])


def _grad_rows(y: np.ndarray, t: np.ndarray, c: np.ndarray, loss: np.ndarray, grad: np.ndarray) -> None:
    """grad = c x (softmax(y) - one_hot(t)) per row, given the rows' `loss` (log-sum-exp minus the target's logit)."""
    # softmax entries below _FLUSH / |c| are set to 0: times c they would be below _FLUSH, nothing next to the
    # row's other entries, but a trained model's logits span enough that many would be subnormal, and the matmul
    # that carries this gradient back through the head runs several times slower on subnormal operands (x86
    # microcode assists; benchmarks/cpu_kernels.py)
    with np.errstate(all="ignore"):        # |c| 0 gives an infinite floor: the row's gradient is 0
        floor = (_FLUSH / np.minimum(1.0, np.abs(c.astype(np.float64)))).astype(np.float32)

    def rows(a: int, b: int) -> None:
        r = np.arange(a, b)
        g = grad[a:b]
        np.subtract(y[a:b], (loss[a:b] + y[r, t[a:b]])[:, None], out=g)   # y - log-sum-exp
        np.exp(g, out=g)                                                   # the softmax
        np.copyto(g, 0.0, where=g < floor[a:b, None])                      # no subnormal products (see above)
        g *= c[a:b, None]
        g[r - a, t[a:b]] -= c[a:b]

    _by_rows(rows, y.shape[0])


@mx.custom_function
def _cross_entropy_numpy(logits: mx.array, targets: mx.array) -> mx.array:
    y = np.asarray(logits)                 # evaluates the logits (the graph behind them is kept for the gradient)
    out = np.empty(y.shape[0], dtype=np.float32)
    _loss_rows(y, np.asarray(targets), out)
    return mx.array(out)


@_cross_entropy_numpy.vjp
def _cross_entropy_numpy_vjp(primals, cotangent, output):
    logits, targets = primals
    y = np.asarray(logits)
    grad = np.empty_like(y)
    _grad_rows(y, np.asarray(targets), np.asarray(cotangent), np.asarray(output), grad)
    return mx.array(grad), mx.zeros_like(targets)


class _Deferred:
    """One cross-entropy met while `numpy_after_trace` is open: MLX arrays whose numpy work waits until the
    gradient's graph is built. `loss` (evaluated now) and `grad` (evaluated in `compute`) are filled in place."""

    def __init__(self, logits: mx.array, targets: mx.array):
        self.logits, self.targets = logits, targets
        self.loss = mx.zeros((logits.shape[0],), dtype=mx.float32)
        mx.eval(self.loss)
        self.cotangent: mx.array | None = None
        self.grad: mx.array | None = None

    def function(self):
        """A custom function of (logits, targets) whose value is `loss` and whose gradient is `grad`."""
        @mx.custom_function
        def deferred(logits, targets):
            return self.loss

        @deferred.vjp
        def deferred_vjp(primals, cotangent, output):
            self.cotangent = cotangent
            self.grad = mx.zeros(self.logits.shape, dtype=mx.float32)     # evaluated after the logits, in compute
            return self.grad, mx.zeros_like(self.targets)

        return deferred

    def compute(self) -> None:
        y, t, loss = np.asarray(self.logits), np.asarray(self.targets), _writable(self.loss)
        if self.grad is None:
            _loss_rows(y, t, loss)
            return
        mx.eval(self.grad)
        grad = _writable(self.grad)
        _loss_rows(y, t, loss, scratch=grad)      # the gradient's buffer holds the exponentials meanwhile
        _grad_rows(y, t, np.asarray(self.cotangent), loss, grad)


def _writable(a: mx.array) -> np.ndarray:
    """A numpy view of an evaluated MLX array that writes into its buffer (what later operations on it read)."""
    view = np.asarray(a)
    if not (view.flags.writeable and view.flags.c_contiguous):
        raise RuntimeError("cpu_kernels: an MLX buffer to fill in place is not a writable contiguous array")
    return view


_pending: list[_Deferred] | None = None       # inside numpy_after_trace: the cross-entropies waiting for it


@contextmanager
def numpy_after_trace():
    """Around a `value_and_grad` call: the numpy cross-entropies it meets run after it returns, not inside it.

    Inside the trace, `np.asarray(logits)` evaluates the forward pass there, and MLX keeps every array of a graph
    evaluated while a gradient is being traced (it does not free the intermediates a later pass needs no more), so
    a `train_free` step of the 270M at batch 16 peaked at 10.1 GB instead of 3.1 GB (benchmarks/memory_plan.py).
    Here each one returns MLX buffers (its loss rows and its gradient) in the graph and leaves them empty; after
    the trace the logits are evaluated (freeing what the gradient does not need, as a normal step does) and numpy
    fills the buffers in place, before anything reads them: the caller evaluates the loss and the gradient only
    after this block. Same values as the eager path."""
    global _pending
    outer, _pending = _pending, []
    try:
        yield
        work = _pending
    finally:
        _pending = outer
    if work:
        mx.eval([w.logits for w in work] + [w.cotangent for w in work if w.cotangent is not None])
        for w in work:
            w.compute()


def cross_entropy(logits: mx.array, targets: mx.array) -> mx.array:
    """`nn.losses.cross_entropy(logits, targets)` for (N, V) float32 logits and (N,) token ids: one loss per row;
    on the CPU device and for wide rows through numpy's exp (see the module docstring)."""
    if (device.has_gpu() or logits.ndim != 2 or logits.dtype != mx.float32
            or logits.shape[1] < _NUMPY_MIN_WIDTH):
        return nn.losses.cross_entropy(logits, targets)
    if _pending is not None:
        deferred = _Deferred(logits, targets)
        _pending.append(deferred)
        return deferred.function()(logits, targets)
    return _cross_entropy_numpy(logits, targets)

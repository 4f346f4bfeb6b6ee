"""The wordle-mlx test suite (unittest; run with `make test` or `python scripts/run_tests.py`)."""

F32_RTOL = 1e-5    # a float32 result computed two ways (another summation order) agrees to about this, relatively


def assert_f32_close(test, actual: float, expected: float, rtol: float = F32_RTOL, scale: float = 0.0,
                     msg: str | None = None) -> None:
    """`actual` equals `expected` up to float32 rounding: |actual - expected| <= rtol * max(|actual|,
    |expected|, scale). `scale` is the size of the terms a sum adds, for a result that can cancel to near 0
    (then its own size says nothing about the rounding). Never an absolute number of places."""
    bound = rtol * max(abs(actual), abs(expected), scale)
    test.assertLessEqual(abs(actual - expected), bound,
                         f"{msg + ': ' if msg else ''}{actual!r} != {expected!r} within rtol {rtol:g} (bound {bound:.3g})")

"""Shared helpers: the error criterion of the project and a readable report of the worst element."""

from __future__ import annotations

import numpy as np

# Absolute floors so that two results that are both ~0 do not fail on a ratio of tiny numbers.
FLOOR = {np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1e-4}


def worst(actual, expected):
    """(max |actual - expected|, index of the worst element), NaN and inf aware."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    same_inf = np.isinf(actual) & np.isinf(expected) & (np.sign(actual) == np.sign(expected))
    with np.errstate(invalid="ignore"):  # inf - inf where both are the same infinity
        diff = np.where(same_inf, 0.0, np.abs(actual - expected))
    diff = np.where(np.isnan(diff), np.inf, diff)
    if diff.size == 0:
        return 0.0, ()
    index = np.unravel_index(np.argmax(diff), diff.shape)
    return float(diff[index]), tuple(int(i) for i in index)


def assert_close_to_reference(name, actual, reference, naive, floor):
    """FlashAttention's criterion: the error against the float64 reference is at most twice the
    error of a naive implementation in the same precision, plus a small floor."""
    error, index = worst(actual, reference)
    naive_error, _ = worst(naive, reference)
    bound = 2 * naive_error + floor
    assert error <= bound, (
        f"{name}: max error {error:.3g} > bound {bound:.3g} (2 x naive {naive_error:.3g} + {floor:g}); "
        f"worst at {index}: got {np.asarray(actual, dtype=np.float64)[index]!r}, "
        f"reference {np.asarray(reference)[index]!r}")


def assert_allclose_report(name, actual, expected, atol, rtol=0.0):
    """|actual - expected| <= atol + rtol * |expected| everywhere; reports the worst violation."""
    actual64 = np.asarray(actual, dtype=np.float64)
    expected64 = np.asarray(expected, dtype=np.float64)
    assert actual64.shape == expected64.shape, f"{name}: shape {actual64.shape} != {expected64.shape}"
    same_inf = np.isinf(actual64) & np.isinf(expected64) & (np.sign(actual64) == np.sign(expected64))
    with np.errstate(invalid="ignore"):
        diff = np.where(same_inf, 0.0, np.abs(actual64 - expected64))
    allowed = atol + rtol * np.where(np.isfinite(expected64), np.abs(expected64), 0.0)
    excess = np.where(np.isnan(diff), np.inf, diff - allowed)
    if excess.size == 0 or excess.max() <= 0:
        return
    index = np.unravel_index(np.argmax(excess), excess.shape)
    raise AssertionError(f"{name}: error {diff[index]:.3g} > {allowed[index]:.3g} at {tuple(map(int, index))}: "
                         f"got {actual64[index]!r}, expected {expected64[index]!r}")

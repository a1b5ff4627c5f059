"""The keyword arguments of every entry point, checked once and carried as one value."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from . import _ext

_UINT64 = (1 << 64) - 1


@dataclass(frozen=True)
class Settings:
    """What the library needs besides the arrays. scale 0.0 stands for 1/sqrt(head_dim)."""

    scale: float
    causal: bool
    window_left: int
    window_right: int
    softcap: float
    dropout_p: float
    deterministic: bool

    def call_options(self, *, seed: int = 0, max_seqlen_q: int = 0, max_seqlen_k: int = 0,
                     cuda_stream: int = 0) -> _ext.CallOptions:
        o = _ext.CallOptions()
        o.scale = self.scale
        o.causal = self.causal
        o.window_left = self.window_left
        o.window_right = self.window_right
        o.softcap = self.softcap
        o.dropout_p = self.dropout_p
        o.seed = seed & _UINT64
        o.max_seqlen_q = max_seqlen_q
        o.max_seqlen_k = max_seqlen_k
        o.deterministic = self.deterministic
        o.cuda_stream = cuda_stream
        return o


def settings(*, causal, window, softcap, dropout_p, scale, deterministic) -> Settings:
    """Checks the Python types of the keyword arguments; the library checks their values."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal={causal!r} must be a bool")
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in window)):
        raise TypeError(f"window={window!r} must be a pair of ints (left, right); -1 means unbounded")
    if scale is None:
        scale = 0.0
    elif not isinstance(scale, numbers.Real):
        raise TypeError(f"scale={scale!r} must be a float or None")
    elif scale == 0:
        raise ValueError("scale=0.0 is not supported: the library reads 0 as the default 1/sqrt(head_dim)")
    for name, value in (("softcap", softcap), ("dropout_p", dropout_p)):
        if not isinstance(value, numbers.Real):
            raise TypeError(f"{name}={value!r} must be a float")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic={deterministic!r} must be a bool")
    return Settings(scale=float(scale), causal=causal, window_left=int(window[0]), window_right=int(window[1]),
                    softcap=float(softcap), dropout_p=float(dropout_p), deterministic=deterministic)


def check_seed(seed) -> None:
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)):
        raise TypeError(f"seed={seed!r} must be an int or None")

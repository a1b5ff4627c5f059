"""Calls on arrays other than PyTorch tensors: numpy, and any DLPack producer (CuPy, JAX, ...).

Inputs go to the library as they are, through DLPack. Outputs are allocated with the caller's
framework: numpy.empty for numpy arrays; for other arrays their array-API namespace's `empty`
(CuPy's own module before it had one), on the same device. CUDA arrays of such producers are exported without a stream, which DLPack
defines as the legacy default stream, so the library runs on that stream.
"""

from __future__ import annotations

import importlib

import numpy as np

from . import _ext
from ._options import Settings


class _Allocator:
    """Allocates outputs like `like`: numpy.empty for numpy, else the array's array-API namespace
    on its device. CuPy before version 15 has no __array_namespace__: its own module serves, under
    the array's device."""

    def __init__(self, like):
        self.numpy = isinstance(like, np.ndarray)
        if self.numpy:
            return
        self.device = like.device
        namespace = getattr(like, "__array_namespace__", None)
        if namespace is not None:
            self.xp, self.device_keyword = namespace(), True
        elif type(like).__module__.split(".")[0] == "cupy":
            self.xp, self.device_keyword = importlib.import_module("cupy"), False
        else:
            raise TypeError(f"cannot allocate results like a {type(like).__name__}: it has no __array_namespace__ "
                            "(pass numpy arrays, torch tensors, CuPy arrays or array-API arrays)")

    def empty(self, shape, dtype):
        if self.numpy:
            return np.empty(shape, dtype=dtype)
        if self.device_keyword:
            return self.xp.empty(shape, dtype=dtype, device=self.device)
        with self.device:
            return self.xp.empty(shape, dtype=dtype)

    def float32(self):
        return np.float32 if self.numpy else self.xp.float32


def _seed_for(settings: Settings, seed) -> int:
    if settings.dropout_p > 0 and seed is None:
        raise ValueError(f"dropout_p={settings.dropout_p} needs an explicit seed for arrays other than torch "
                         "tensors: the backward pass must redraw the same dropout mask")
    return 0 if seed is None else int(seed)


def forward(q, k, v, settings: Settings, *, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
            max_seqlen_q: int = 0, max_seqlen_k: int = 0, seed=None):
    """Returns (out, lse) allocated like q."""
    alloc = _Allocator(q)
    if cu_seqlens_q is None:
        batch, seqlen_q, heads = q.shape[0], q.shape[1], q.shape[2]
        out = alloc.empty((batch, seqlen_q, heads, v.shape[-1]), q.dtype)
        lse = alloc.empty((batch, heads, seqlen_q), alloc.float32())
    else:
        total_q, heads = q.shape[0], q.shape[1]
        out = alloc.empty((total_q, heads, v.shape[-1]), q.dtype)
        lse = alloc.empty((heads, total_q), alloc.float32())
    options = settings.call_options(seed=_seed_for(settings, seed), max_seqlen_q=max_seqlen_q,
                                    max_seqlen_k=max_seqlen_k)
    _ext.forward(q, k, v, out, lse, options, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                 cu_seqlens_k=cu_seqlens_k)
    return out, lse


def backward(dout, q, k, v, out, lse, settings: Settings, *, alibi_slopes=None, cu_seqlens_q=None,
             cu_seqlens_k=None, max_seqlen_q: int = 0, max_seqlen_k: int = 0, seed=None):
    """Returns (dq, dk, dv) allocated like q, k and v."""
    alloc = _Allocator(q)
    dq = alloc.empty(q.shape, q.dtype)
    dk = alloc.empty(k.shape, k.dtype)
    dv = alloc.empty(v.shape, v.dtype)
    options = settings.call_options(seed=_seed_for(settings, seed), max_seqlen_q=max_seqlen_q,
                                    max_seqlen_k=max_seqlen_k)
    _ext.backward(dout, q, k, v, out, lse, dq, dk, dv, options, alibi_slopes=alibi_slopes,
                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return dq, dk, dv

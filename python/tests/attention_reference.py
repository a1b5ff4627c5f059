"""Naive attention in numpy, forward and backward, with every feature of the library, written from
the definitions in the design contract (bottom-right masks, softcap, ALiBi, Philox dropout, GQA).
Computed in float64 it is the reference the tests measure errors against; computed in the input's
own precision it is the "naive implementation" whose error sets the tolerance."""

from __future__ import annotations

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_LOW32 = np.uint64(0xFFFFFFFF)


def _philox4x32_7(c0, c1, c2, c3, k0, k1):
    """Philox4x32 with 7 rounds on uint64 arrays holding 32-bit values."""
    for _ in range(7):
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0) & _LOW32, p1 & _LOW32, \
            ((p0 >> np.uint64(32)) ^ c3 ^ k1) & _LOW32, p0 & _LOW32
        k0, k1 = (k0 + _W0) & _LOW32, (k1 + _W1) & _LOW32
    return c0, c1, c2, c3


def dropout_keep(p: float, seed: int, batch_head: int, seqlen_q: int, seqlen_k: int, offset: int = 0) -> np.ndarray:
    """Keep mask [seqlen_q, seqlen_k] of one (batch, query head): key j of row i is kept iff the
    16-bit draw for (batch_head, i, j) is at least floor(p * 65536)."""
    threshold = int(p * 65536.0)
    i = np.arange(seqlen_q, dtype=np.uint64)[:, None]
    j = np.arange(seqlen_k, dtype=np.uint64)[None, :]
    seed, offset = np.uint64(seed), np.uint64(offset)
    k0 = seed & _LOW32
    k1 = ((seed >> np.uint64(32)) + (offset >> np.uint64(32))) & _LOW32
    words = _philox4x32_7(j >> np.uint64(3), np.broadcast_to(i, (seqlen_q, seqlen_k)),
                          np.full((seqlen_q, seqlen_k), batch_head, np.uint64), np.full((seqlen_q, seqlen_k),
                                                                                       offset & _LOW32),
                          k0, k1)
    lane = (j & np.uint64(7)).astype(np.int64)
    word = np.choose(np.broadcast_to(lane >> 1, (seqlen_q, seqlen_k)), words)
    draw = (word >> ((lane & 1) * 16).astype(np.uint64)) & np.uint64(0xFFFF)
    return draw >= np.uint64(threshold)


def visible(seqlen_q: int, seqlen_k: int, window=(-1, -1)) -> np.ndarray:
    """Bottom-right aligned window mask [seqlen_q, seqlen_k]."""
    left, right = window
    diagonal = np.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
    j = np.arange(seqlen_k)[None, :]
    mask = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        mask &= j >= diagonal - left
    if right >= 0:
        mask &= j <= diagonal + right
    return mask


class _Head:
    """Scores and probabilities of one (batch, query head) in the compute dtype."""

    def __init__(self, q, k, v, scale, window, softcap, slope, keep, dropout_p):
        seqlen_q, seqlen_k = q.shape[0], k.shape[0]
        self.q, self.k, self.v, self.scale, self.softcap = q, k, v, scale, softcap
        self.capped = scale * (q @ k.T)
        if softcap > 0:
            self.capped = softcap * np.tanh(self.capped / softcap)
        z = self.capped.copy()
        if slope is not None:
            z -= slope * np.abs(np.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q - np.arange(seqlen_k)[None, :])
        mask = visible(seqlen_q, seqlen_k, window)
        z = np.where(mask, z, -np.inf)
        row_max = z.max(axis=1, initial=-np.inf, keepdims=True)
        finite_max = np.where(np.isfinite(row_max), row_max, 0)
        e = np.where(mask, np.exp(z - finite_max), 0)
        total = e.sum(axis=1, keepdims=True)
        self.p = np.where(total > 0, e / np.where(total > 0, total, 1), 0)
        self.lse = np.where(total[:, 0] > 0, np.log(np.where(total[:, 0] > 0, total[:, 0], 1)) + finite_max[:, 0],
                            -np.inf)
        self.drop = keep / (1 - dropout_p) if keep is not None else 1
        self.out = (self.p * self.drop) @ v

    def backward(self, dout):
        dv = (self.p * self.drop).T @ dout
        dp = (dout @ self.v.T) * self.drop
        dz = self.p * (dp - (dp * self.p).sum(axis=1, keepdims=True))
        if self.softcap > 0:
            dz = dz * (1 - (self.capped / self.softcap) ** 2)
        return self.scale * dz @ self.k, self.scale * dz.T @ self.q, dv


def _heads(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=0,
           scale=None, dtype=np.float64):
    """Yields (batch, query head, kv head, _Head) over a dense BSHD problem."""
    batch, _, heads_q, d = q.shape
    heads_kv = k.shape[2]
    scale = 1 / np.sqrt(d) if scale is None else scale
    window = (window[0], 0) if causal else tuple(window)
    for b in range(batch):
        for h in range(heads_q):
            hk = h // (heads_q // heads_kv)
            slope = None
            if alibi_slopes is not None:
                slope = alibi_slopes[h] if alibi_slopes.ndim == 1 else alibi_slopes[b, h]
            keep = None
            if dropout_p > 0:
                keep = dropout_keep(dropout_p, seed, b * heads_q + h, q.shape[1], k.shape[1])
            yield b, h, hk, _Head(q[b, :, h].astype(dtype), k[b, :, hk].astype(dtype), v[b, :, hk].astype(dtype),
                                  dtype(scale), window, softcap, slope, keep, dropout_p)


def forward(q, k, v, dtype=np.float64, **features):
    """(out [batch, seqlen_q, heads_q, d_v], lse [batch, heads_q, seqlen_q]) in `dtype`."""
    batch, seqlen_q, heads_q, _ = q.shape
    out = np.zeros((batch, seqlen_q, heads_q, v.shape[-1]), dtype)
    lse = np.zeros((batch, heads_q, seqlen_q), dtype)
    for b, h, _, head in _heads(q, k, v, dtype=dtype, **features):
        out[b, :, h], lse[b, h] = head.out, head.lse
    return out, lse


def backward(dout, q, k, v, dtype=np.float64, **features):
    """(dq, dk, dv) in `dtype`; dk, dv summed over the query heads of a group."""
    dq, dk, dv = np.zeros(q.shape, dtype), np.zeros(k.shape, dtype), np.zeros(v.shape, dtype)
    for b, h, hk, head in _heads(q, k, v, dtype=dtype, **features):
        g_q, g_k, g_v = head.backward(dout[b, :, h].astype(dtype))
        dq[b, :, h] = g_q
        dk[b, :, hk] += g_k
        dv[b, :, hk] += g_v
    return dq, dk, dv


def unpack_varlen(x, cu_seqlens, b):
    """Sequence b of a packed [total, heads, d] array, as a dense [1, len, heads, d] array."""
    return x[cu_seqlens[b]:cu_seqlens[b + 1]][None]

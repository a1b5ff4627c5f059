"""PyTorch integration: the library as two custom operators, flashattn::forward and
flashattn::backward, with fake (meta) implementations for tracing and an autograd formula, so
that torch.compile(fullgraph=True) sees one opaque node and autograd gets exact gradients.

Dropout: the forward takes the seed as a one-element int64 CPU tensor. When the caller gives no seed,
it is drawn from torch's default generator (so torch.manual_seed makes runs repeatable); autograd
saves it and the backward redraws the same keep mask from it instead of storing the mask.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from . import _ext
from ._options import Settings

Tensor = torch.Tensor


def _last_dim_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def _device_context(x: Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _call_extras(x: Tensor) -> dict:
    """Stream and workspace allocator for the library: PyTorch's current stream on CUDA, and
    workspace from PyTorch's caching allocator so it is ordered on that stream."""
    if not x.is_cuda:
        return {"cuda_stream": 0, "allocate": None}
    device = x.device
    return {"cuda_stream": torch.cuda.current_stream(device).cuda_stream,
            "allocate": lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=device)}


def _options(settings: tuple, dropout_seed: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
             cuda_stream: int) -> _ext.CallOptions:
    seed = int(dropout_seed.item()) if dropout_seed is not None else 0
    return Settings(*settings).call_options(seed=seed, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                            cuda_stream=cuda_stream)


def _output_shapes(q: Tensor, v: Tensor, varlen: bool):
    if varlen:
        total_q, heads = q.shape[0], q.shape[1]
        return (total_q, heads, v.shape[-1]), (heads, total_q)
    batch, seqlen_q, heads = q.shape[0], q.shape[1], q.shape[2]
    return (batch, seqlen_q, heads, v.shape[-1]), (batch, heads, seqlen_q)


@torch.library.custom_op("flashattn::forward", mutates_args=())
def _forward_op(q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, scale: float, causal: bool,
                window_left: int, window_right: int, softcap: float, dropout_p: float,
                dropout_seed: Optional[Tensor], deterministic: bool) -> tuple[Tensor, Tensor]:
    out_shape, lse_shape = _output_shapes(q, v, cu_seqlens_q is not None)
    out = q.new_empty(out_shape)
    lse = q.new_empty(lse_shape, dtype=torch.float32)
    extras = _call_extras(q)
    options = _options((scale, causal, window_left, window_right, softcap, dropout_p, deterministic), dropout_seed,
                       max_seqlen_q, max_seqlen_k, extras["cuda_stream"])
    with _device_context(q):
        _ext.forward(q, k, v, out, lse, options, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                     cu_seqlens_k=cu_seqlens_k, allocate=extras["allocate"])
    return out, lse


@_forward_op.register_fake
def _(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, window_left,
      window_right, softcap, dropout_p, dropout_seed, deterministic):
    out_shape, lse_shape = _output_shapes(q, v, cu_seqlens_q is not None)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("flashattn::backward", mutates_args=())
def _backward_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                 alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                 max_seqlen_q: int, max_seqlen_k: int, scale: float, causal: bool, window_left: int,
                 window_right: int, softcap: float, dropout_p: float, dropout_seed: Optional[Tensor],
                 deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    extras = _call_extras(q)
    options = _options((scale, causal, window_left, window_right, softcap, dropout_p, deterministic), dropout_seed,
                       max_seqlen_q, max_seqlen_k, extras["cuda_stream"])
    with _device_context(q):
        _ext.backward(dout, q, k, v, out, lse, dq, dk, dv, options, alibi_slopes=alibi_slopes,
                      cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, allocate=extras["allocate"])
    return dq, dk, dv


@_backward_op.register_fake
def _(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal,
      window_left, window_right, softcap, dropout_p, dropout_seed, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_FORWARD_INPUTS = 16  # arguments of flashattn::forward; autograd returns one gradient for each


def _setup_context(ctx, inputs, output):
    (q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, window_left,
     window_right, softcap, dropout_p, dropout_seed, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, dropout_seed)
    ctx.scalars = (max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, softcap, dropout_p)
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, dropout_seed = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.backward(_last_dim_contiguous(dout), q, k, v, out, lse, alibi_slopes,
                                              cu_seqlens_q, cu_seqlens_k, *ctx.scalars, dropout_seed,
                                              ctx.deterministic)
    return (dq, dk, dv) + (None,) * (_FORWARD_INPUTS - 3)


torch.library.register_autograd("flashattn::forward", _backward, setup_context=_setup_context)


def seed_tensor(settings: Settings, seed) -> Optional[Tensor]:
    """The dropout seed as a one-element int64 CPU tensor, or None without dropout."""
    if settings.dropout_p == 0:
        return None
    if seed is None:
        return torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64)
    seed = int(seed) & ((1 << 64) - 1)  # the library's seed is a uint64; the tensor holds its bits
    return torch.tensor([seed - (1 << 64) if seed >= 1 << 63 else seed], dtype=torch.int64)


def forward(q, k, v, settings: Settings, *, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
            max_seqlen_q: int = 0, max_seqlen_k: int = 0, seed=None):
    s = settings
    return torch.ops.flashattn.forward(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, s.scale, s.causal, s.window_left, s.window_right, s.softcap,
                                       s.dropout_p, seed_tensor(s, seed), s.deterministic)


def backward(dout, q, k, v, out, lse, settings: Settings, *, alibi_slopes=None, cu_seqlens_q=None,
             cu_seqlens_k=None, max_seqlen_q: int = 0, max_seqlen_k: int = 0, seed=None):
    s = settings
    if s.dropout_p > 0 and seed is None:
        raise ValueError(f"dropout_p={s.dropout_p} needs the forward's seed to redraw its dropout mask")
    dout, q, k, v, out, lse = (x.detach() for x in (dout, q, k, v, out, lse))
    return torch.ops.flashattn.backward(_last_dim_contiguous(dout), q, k, v, out, lse, alibi_slopes,
                                        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, s.scale, s.causal,
                                        s.window_left, s.window_right, s.softcap, s.dropout_p,
                                        seed_tensor(s, seed), s.deterministic)

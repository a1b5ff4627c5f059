"""The public functions. Each takes numpy arrays, PyTorch tensors (CPU or CUDA) or any DLPack
array and returns results of the caller's array type. PyTorch tensors go through the custom
operators of _torch_ops (autograd, torch.compile); everything else through _arrays.

Layout: dense calls take q [batch, seqlen_q, heads_q, head_dim], k/v [batch, seqlen_k, heads_kv, ...]
(BSHD, any strides with a contiguous last dimension: a transposed BHSD tensor is fine as it is).
"""

from __future__ import annotations

from . import _arrays, _ext
from ._options import check_seed, settings

try:
    import torch

    from . import _torch_ops
except ImportError:  # PyTorch is optional
    torch = None
    _torch_ops = None


def _is_torch(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _backend_for(x):
    return _torch_ops if _is_torch(x) else _arrays


def _check_arrays(rank: int, layout: str, **arrays) -> None:
    """Each argument is an array of the given rank, of q's dtype (the first one's)."""
    first_name, first = next(iter(arrays.items()))
    for name, x in arrays.items():
        if not hasattr(x, "__dlpack__"):
            raise TypeError(f"{name} of type {type(x).__name__} is not an array: expected a numpy array, a "
                            "torch.Tensor or another object with __dlpack__")
        if len(x.shape) != rank:
            raise ValueError(f"{name}.ndim={len(x.shape)} must be {rank} ({layout})")
        if x.dtype != first.dtype:
            raise TypeError(f"{name}.dtype={x.dtype} must match {first_name}.dtype={first.dtype}")


def backend_available(name: str) -> bool:
    """Whether the backend "cpu" or "cuda" is compiled in and usable on this machine."""
    return _ext.backend_available(name)


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None,
              scale=None, return_lse=False, deterministic=False):
    """out = softmax(scale * q kᵀ + masks/biases) v, computed without storing the score matrix.

    q [batch, seqlen_q, heads_q, d], k [batch, seqlen_k, heads_kv, d], v [batch, seqlen_k, heads_kv, d_v];
    heads_kv divides heads_q (GQA/MQA). Masks align the last query with the last key (bottom-right):
    key j is visible from query i iff i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right,
    with window = (left, right), -1 unbounded; causal is window (-1, 0). softcap c > 0 maps each score s
    to c * tanh(s / c). alibi_slopes: float32 [heads_q] or [batch, heads_q], adding -slope * |i + seqlen_k
    - seqlen_q - j|. dropout_p drops attention probabilities, keyed on seed (drawn from torch's generator
    for torch tensors when None; other arrays need one). scale defaults to 1/sqrt(d). deterministic makes
    the backward pass bit-identical run to run.

    Returns out [batch, seqlen_q, heads_q, d_v], or (out, lse) with return_lse: lse [batch, heads_q, seqlen_q]
    float32, the natural-log log-sum-exp of each row (-inf for a row that sees no key; its out row is 0).
    """
    s = settings(causal=causal, window=window, softcap=softcap, dropout_p=dropout_p, scale=scale,
                 deterministic=deterministic)
    check_seed(seed)
    _check_arrays(4, "[batch, seqlen, heads, head_dim]", q=q, k=k, v=v)
    out, lse = _backend_for(q).forward(q, k, v, s, alibi_slopes=alibi_slopes, seed=seed)
    return (out, lse) if return_lse else out


def attention_backward(dout, q, k, v, out, lse, *, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
                       dropout_p=0.0, seed=None, scale=None, deterministic=False):
    """Gradients (dq, dk, dv) of attention() from dout and the forward's out and lse.

    Takes the forward's keyword arguments, which must be the same (with dropout, the same seed).
    dk and dv sum over the query heads that share a key/value head.
    """
    s = settings(causal=causal, window=window, softcap=softcap, dropout_p=dropout_p, scale=scale,
                 deterministic=deterministic)
    check_seed(seed)
    _check_arrays(4, "[batch, seqlen, heads, head_dim]", q=q, k=k, v=v, out=out, dout=dout)
    return _backend_for(q).backward(dout, q, k, v, out, lse, s, alibi_slopes=alibi_slopes, seed=seed)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     window=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None, scale=None,
                     return_lse=False, deterministic=False):
    """attention() over a batch of sequences of different lengths, packed without padding.

    q [total_q, heads_q, d], k/v [total_k, heads_kv, ...]; sequence b holds rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q (int32 [batch + 1], starting at 0, on q's device), likewise
    for k/v; max_seqlen_q/k bound the lengths. Masks align each sequence bottom-right as in attention().
    Returns out [total_q, heads_q, d_v], or (out, lse) with lse [heads_q, total_q].
    """
    s = settings(causal=causal, window=window, softcap=softcap, dropout_p=dropout_p, scale=scale,
                 deterministic=deterministic)
    check_seed(seed)
    _check_arrays(3, "[total_tokens, heads, head_dim]", q=q, k=k, v=v)
    out, lse = _backend_for(q).forward(q, k, v, s, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                                       cu_seqlens_k=cu_seqlens_k, max_seqlen_q=int(max_seqlen_q),
                                       max_seqlen_k=int(max_seqlen_k), seed=seed)
    return (out, lse) if return_lse else out


def attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                              causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                              seed=None, scale=None, deterministic=False):
    """Gradients (dq, dk, dv) of attention_varlen(), like attention_backward()."""
    s = settings(causal=causal, window=window, softcap=softcap, dropout_p=dropout_p, scale=scale,
                 deterministic=deterministic)
    check_seed(seed)
    _check_arrays(3, "[total_tokens, heads, head_dim]", q=q, k=k, v=v, out=out, dout=dout)
    return _backend_for(q).backward(dout, q, k, v, out, lse, s, alibi_slopes=alibi_slopes,
                                    cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                    max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k), seed=seed)


def _swap_seq_and_heads(x):
    """BHSD <-> BSHD as a view."""
    if _is_torch(x):
        return x.transpose(1, 2)
    if hasattr(x, "swapaxes"):
        return x.swapaxes(1, 2)
    return x.__array_namespace__().permute_dims(x, (0, 2, 1, 3))


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's semantics on this library.

    query [batch, heads_q, seqlen_q, d], key/value [batch, heads_kv, seqlen_k, ...] (BHSD); the result is
    [batch, heads_q, seqlen_q, d_v] of the caller's array type. is_causal aligns the mask top-left as
    PyTorch does (query i sees keys j <= i), mapped onto the library's bottom-right window: with
    seqlen_q > seqlen_k it is window (-1, seqlen_q - seqlen_k); with seqlen_q < seqlen_k the keys from
    seqlen_q on are never visible, so they are left out (a view) and the mask is the plain causal one.
    attn_mask is not supported: masks that are a band or a causal pattern are expressed through
    flashattn.attention's window, biases through alibi_slopes.
    """
    if attn_mask is not None:
        raise ValueError("attn_mask is not supported by flashattn.sdpa; use is_causal, or flashattn.attention "
                         "with window=(left, right) or alibi_slopes")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal={is_causal!r} must be a bool")
    _check_arrays(4, "[batch, heads, seqlen, head_dim]", query=query, key=key, value=value)
    heads_q, heads_kv = query.shape[1], key.shape[1]
    if heads_q != heads_kv and not enable_gqa:
        raise ValueError(f"query.shape[1]={heads_q} != key.shape[1]={heads_kv}: different head counts need "
                         "enable_gqa=True")
    if heads_q % heads_kv != 0:
        raise ValueError(f"key.shape[1]={heads_kv} must divide query.shape[1]={heads_q} (grouped-query attention)")
    q, k, v = (_swap_seq_and_heads(x) for x in (query, key, value))
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    window = (-1, -1)
    if is_causal:
        if seqlen_q > seqlen_k:
            window = (-1, seqlen_q - seqlen_k)
        else:
            k, v = k[:, :seqlen_q], v[:, :seqlen_q]
            window = (-1, 0)
    out = attention(q, k, v, window=window, dropout_p=dropout_p, scale=scale)
    return _swap_seq_and_heads(out)

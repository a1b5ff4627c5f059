"""flash-attn 2.x's functions on this library: switching is one import,

    from flashattn.compat import flash_attn_func      # instead of: from flash_attn import ...

Same signatures, BSHD layout, bottom-right causal masks, window_size, softcap, ALiBi, GQA/MQA,
deterministic backward, and flash-attn's argument rules (causal sets window_size[1] = 0; a window
side at least seqlen_k long is unbounded; tensors whose last dimension is strided are made
contiguous). One difference: return_attn_probs=True returns (out, softmax_lse, None); the
dropout-mask-and-probabilities tensor S_dmask that flash-attn returns for testing is not computed.
Paged KV caches (block_table) are not supported.
"""

from __future__ import annotations

from .api import _is_torch, attention, attention_varlen


def _maybe_contiguous(x):
    if _is_torch(x) and x.stride(-1) != 1:
        return x.contiguous()
    return x


def _window(window_size, causal: bool, seqlen_k: int):
    left, right = window_size
    left = -1 if left >= seqlen_k else left
    right = -1 if right >= seqlen_k else right
    return (left, 0 if causal else right)


def _result(out, lse, return_attn_probs: bool):
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [batch, seqlen_q, heads, d], k/v [batch, seqlen_k, heads_kv, d] -> out [batch, seqlen_q, heads, d];
    with return_attn_probs, (out, softmax_lse [batch, heads, seqlen_q], None)."""
    q, k, v = (_maybe_contiguous(x) for x in (q, k, v))
    out, lse = attention(q, k, v, causal=causal, window=_window(window_size, causal, k.shape[1]), softcap=softcap,
                         alibi_slopes=alibi_slopes, dropout_p=dropout_p, scale=softmax_scale, return_lse=True,
                         deterministic=deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv [batch, seqlen, 3, heads, d]; q, k and v are read in place from it."""
    qkv = _maybe_contiguous(qkv)
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [batch, seqlen_q, heads, d], kv [batch, seqlen_k, 2, heads_kv, d]."""
    kv = _maybe_contiguous(kv)
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q [total_q, heads, d], k/v [total_k, heads_kv, d], cu_seqlens int32 [batch + 1] ->
    out [total_q, heads, d]; with return_attn_probs, (out, softmax_lse [heads, total_q], None)."""
    if block_table is not None:
        raise ValueError("block_table (a paged KV cache) is not supported by flashattn")
    q, k, v = (_maybe_contiguous(x) for x in (q, k, v))
    out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                window=_window(window_size, causal, max_seqlen_k), softcap=softcap,
                                alibi_slopes=alibi_slopes, dropout_p=dropout_p, scale=softmax_scale,
                                return_lse=True, deterministic=deterministic)
    return _result(out, lse, return_attn_probs)

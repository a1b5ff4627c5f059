"""numpy arrays on the CPU backend against the float64 numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

import attention_reference as ref
import flashattn
from checks import FLOOR, assert_allclose_report, assert_close_to_reference

# (name, keyword arguments of flashattn.attention); the reference takes the same ones.
FEATURES = [
    ("plain", {}),
    ("causal", {"causal": True}),
    ("window", {"window": (5, 2)}),
    ("window_left_only", {"window": (7, -1)}),
    ("softcap", {"softcap": 2.0, "scale": 0.9}),
    ("alibi_heads", {"alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625], np.float32), "causal": True}),
    ("alibi_batch", {"alibi_slopes": np.linspace(0.05, 0.4, 8, dtype=np.float32).reshape(2, 4)}),
    ("dropout", {"dropout_p": 0.25, "seed": 1234}),
    ("everything", {"causal": True, "window": (9, 0), "softcap": 3.0, "dropout_p": 0.1, "seed": 2**40 + 7,
                    "alibi_slopes": np.array([0.3, 0.2, 0.1, 0.05], np.float32)}),
]
# (seqlen_q, seqlen_k): single rows, lengths that are no multiple of a tile, more and fewer keys.
LENGTHS = [(1, 1), (17, 17), (33, 70), (70, 33), (1, 65)]


def make_inputs(rng, seqlen_q, seqlen_k, dtype, heads_kv=2, head_dim=16, head_dim_v=None, batch=2, heads_q=4):
    q = rng.standard_normal((batch, seqlen_q, heads_q, head_dim)).astype(dtype)
    k = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim)).astype(dtype)
    v = rng.standard_normal((batch, seqlen_k, heads_kv, head_dim_v or head_dim)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("seqlen_q,seqlen_k", LENGTHS)
@pytest.mark.parametrize("name,features", FEATURES, ids=[f[0] for f in FEATURES])
def test_forward_matches_reference(name, features, seqlen_q, seqlen_k, dtype):
    rng = np.random.default_rng(seqlen_q * 100 + seqlen_k)
    q, k, v = make_inputs(rng, seqlen_q, seqlen_k, dtype)
    out, lse = flashattn.attention(q, k, v, return_lse=True, **features)
    assert type(out) is np.ndarray and out.dtype == dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (2, 4, seqlen_q)
    ref_out, ref_lse = ref.forward(q, k, v, **features)
    naive_out, naive_lse = ref.forward(q, k, v, dtype=np.float32, **features)
    floor = FLOOR[np.dtype(dtype)]
    assert_close_to_reference(f"{name} out", out, ref_out, naive_out.astype(dtype), floor)
    assert_close_to_reference(f"{name} lse", lse, ref_lse, naive_lse.astype(np.float32), floor)


@pytest.mark.parametrize("seqlen_q,seqlen_k", LENGTHS)
@pytest.mark.parametrize("name,features", FEATURES, ids=[f[0] for f in FEATURES])
def test_backward_matches_reference(name, features, seqlen_q, seqlen_k):
    rng = np.random.default_rng(7 + seqlen_q * 100 + seqlen_k)
    q, k, v = make_inputs(rng, seqlen_q, seqlen_k, np.float32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    out, lse = flashattn.attention(q, k, v, return_lse=True, **features)
    grads = flashattn.attention_backward(dout, q, k, v, out, lse, **features)
    expected = ref.backward(dout, q, k, v, **features)
    naive = ref.backward(dout, q, k, v, dtype=np.float32, **features)
    for grad_name, got, want, baseline, x in zip(("dq", "dk", "dv"), grads, expected, naive, (q, k, v)):
        assert got.shape == x.shape and got.dtype == x.dtype
        assert_close_to_reference(f"{name} {grad_name}", got, want, baseline, FLOOR[np.dtype(np.float32)])


def test_head_dim_of_v_may_differ():
    rng = np.random.default_rng(3)
    q, k, v = make_inputs(rng, 9, 12, np.float32, head_dim=16, head_dim_v=24)
    out = flashattn.attention(q, k, v, causal=True)
    assert out.shape == (2, 9, 4, 24)
    assert_allclose_report("out", out, ref.forward(q, k, v, causal=True)[0], atol=1e-5)


def test_bhsd_views_need_no_copy():
    """A [batch, heads, seq, dim] array seen through swapaxes is a valid BSHD operand as it is."""
    rng = np.random.default_rng(4)
    q, k, v = (np.ascontiguousarray(x.swapaxes(1, 2)) for x in make_inputs(rng, 20, 31, np.float32))
    views = [x.swapaxes(1, 2) for x in (q, k, v)]
    assert not views[0].flags.c_contiguous
    out = flashattn.attention(*views, causal=True)
    expected = flashattn.attention(*(np.ascontiguousarray(x) for x in views), causal=True)
    np.testing.assert_array_equal(out, expected)


def test_packed_qkv_is_read_in_place():
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((2, 19, 3, 4, 16)).astype(np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out = flashattn.attention(q, k, v)
    assert_allclose_report("out", out, ref.forward(q, k, v)[0], atol=1e-5)


def test_fully_masked_rows_give_zero_and_minus_infinity():
    """Bottom-right causal with more queries than keys: the first seqlen_q - seqlen_k rows see nothing."""
    rng = np.random.default_rng(6)
    q, k, v = make_inputs(rng, 10, 4, np.float32)
    out, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :6] == 0) and np.all(np.isneginf(lse[:, :, :6]))
    assert np.all(np.isfinite(lse[:, :, 6:])) and not np.isnan(out).any()
    dq, dk, dv = flashattn.attention_backward(np.ones_like(out), q, k, v, out, lse, causal=True)
    assert not any(np.isnan(g).any() for g in (dq, dk, dv))
    assert np.all(dq[:, :6] == 0)


def test_dropout_is_a_function_of_the_seed():
    rng = np.random.default_rng(8)
    q, k, v = make_inputs(rng, 16, 16, np.float32)
    first = flashattn.attention(q, k, v, dropout_p=0.5, seed=11)
    np.testing.assert_array_equal(first, flashattn.attention(q, k, v, dropout_p=0.5, seed=11))
    assert not np.array_equal(first, flashattn.attention(q, k, v, dropout_p=0.5, seed=12))


def test_generic_dlpack_producer():
    """An array type the package knows nothing about, reached through __dlpack__ and its
    array-API namespace: the results come back from that namespace."""

    class Producer:
        def __init__(self, array):
            self._array = array
            self.shape, self.dtype, self.device = array.shape, array.dtype, "cpu"

        def __dlpack__(self, **kwargs):
            return self._array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._array.__dlpack_device__()

        def __array_namespace__(self):
            return np

    if not hasattr(np, "from_dlpack") or tuple(map(int, np.__version__.split(".")[:2])) < (2, 0):
        pytest.skip("needs numpy >= 2 (empty(device=...) of the array API)")
    rng = np.random.default_rng(9)
    q, k, v = make_inputs(rng, 8, 8, np.float32)
    out = flashattn.attention(Producer(q), Producer(k), Producer(v), causal=True)
    assert_allclose_report("out", out, ref.forward(q, k, v, causal=True)[0], atol=1e-5)


class TestVarlen:
    CU_Q = np.array([0, 5, 5, 22, 23], np.int32)  # lengths 5, 0 (empty), 17, 1
    CU_K = np.array([0, 9, 12, 12, 40], np.int32)  # lengths 9, 3, 0, 28

    def inputs(self, seed):
        rng = np.random.default_rng(seed)
        q = rng.standard_normal((23, 4, 16)).astype(np.float32)
        k = rng.standard_normal((40, 2, 16)).astype(np.float32)
        v = rng.standard_normal((40, 2, 16)).astype(np.float32)
        return q, k, v

    @pytest.mark.parametrize("features", [{}, {"causal": True}, {"window": (4, 1), "softcap": 2.0},
                                          {"dropout_p": 0.2, "seed": 99}])
    def test_forward_and_backward_per_sequence(self, features):
        q, k, v = self.inputs(10)
        dout = np.random.default_rng(11).standard_normal(q.shape).astype(np.float32)
        args = (self.CU_Q, self.CU_K, 17, 28)
        out, lse = flashattn.attention_varlen(q, k, v, *args, return_lse=True, **features)
        assert out.shape == (23, 4, 16) and lse.shape == (4, 23)
        dq, dk, dv = flashattn.attention_varlen_backward(dout, q, k, v, out, lse, *args, **features)
        for b in range(len(self.CU_Q) - 1):
            qs, ks, vs, douts = (ref.unpack_varlen(x, cu, b) for x, cu in
                                 ((q, self.CU_Q), (k, self.CU_K), (v, self.CU_K), (dout, self.CU_Q)))
            ref_out, ref_lse = _reference_sequence(qs, ks, vs, b, features)
            rows = slice(self.CU_Q[b], self.CU_Q[b + 1])
            keys = slice(self.CU_K[b], self.CU_K[b + 1])
            assert_allclose_report(f"out of sequence {b}", out[rows], ref_out[0], atol=2e-5)
            assert_allclose_report(f"lse of sequence {b}", lse[:, rows], ref_lse[0], atol=2e-5)
            ref_dq, ref_dk, ref_dv = _reference_sequence_backward(douts, qs, ks, vs, b, features)
            assert_allclose_report(f"dq of sequence {b}", dq[rows], ref_dq[0], atol=5e-5)
            assert_allclose_report(f"dk of sequence {b}", dk[keys], ref_dk[0], atol=5e-5)
            assert_allclose_report(f"dv of sequence {b}", dv[keys], ref_dv[0], atol=5e-5)


def _reference_sequence(q, k, v, batch_index, features):
    """Reference of sequence `batch_index` alone, with dropout keyed on its batch index."""
    return _shift_batch(ref.forward, (q, k, v), batch_index, features)


def _reference_sequence_backward(dout, q, k, v, batch_index, features):
    return _shift_batch(ref.backward, (dout, q, k, v), batch_index, features)


def _shift_batch(function, arrays, batch_index, features):
    """Runs `function` on a batch of batch_index + 1 copies and keeps the last, so that dropout
    draws with the sequence's own batch index."""
    tiled = [np.concatenate([x] * (batch_index + 1)) for x in arrays]
    return tuple(r[batch_index:] for r in function(*tiled, **features))


class TestErrors:
    def inputs(self):
        return make_inputs(np.random.default_rng(0), 4, 4, np.float32)

    def test_heads_not_divisible_names_both_values(self):
        q, _, _ = self.inputs()
        k = np.zeros((2, 4, 3, 16), np.float32)
        with pytest.raises(ValueError, match=r"k\.shape\[2\]=3 must divide q\.shape\[2\]=4"):
            flashattn.attention(q, k, k)

    def test_float64_is_a_type_error(self):
        q, k, v = (x.astype(np.float64) for x in self.inputs())
        with pytest.raises(TypeError, match=r"q\.dtype=float64 is not supported"):
            flashattn.attention(q, k, v)

    def test_mismatched_dtypes(self):
        q, k, v = self.inputs()
        with pytest.raises(TypeError, match=r"k\.dtype=float16 must match q\.dtype=float32"):
            flashattn.attention(q, k.astype(np.float16), v)

    def test_strided_last_dimension_is_rejected_not_copied(self):
        q, k, v = self.inputs()
        wide = np.zeros((2, 4, 4, 32), np.float32)
        with pytest.raises(ValueError, match=r"q\.strides\[3\]=2 must be 1"):
            flashattn.attention(wide[..., ::2], k, v)

    def test_window_below_minus_one(self):
        with pytest.raises(ValueError, match=r"window_left=-2"):
            flashattn.attention(*self.inputs(), window=(-2, 0))

    def test_dropout_out_of_range(self):
        with pytest.raises(ValueError, match=r"dropout_p=1 must be in \[0, 1\)"):
            flashattn.attention(*self.inputs(), dropout_p=1.0, seed=0)

    def test_dropout_without_seed(self):
        with pytest.raises(ValueError, match="explicit seed"):
            flashattn.attention(*self.inputs(), dropout_p=0.1)

    def test_causal_contradicts_window(self):
        with pytest.raises(ValueError, match=r"window_right=3 contradicts options\.causal=1"):
            flashattn.attention(*self.inputs(), causal=True, window=(-1, 3))

    def test_wrong_rank(self):
        q, k, v = self.inputs()
        with pytest.raises(ValueError, match=r"q\.ndim=3 must be 4"):
            flashattn.attention(q[0], k, v)

    def test_not_an_array(self):
        _, k, v = self.inputs()
        with pytest.raises(TypeError, match="is not an array"):
            flashattn.attention([[[[1.0]]]], k, v)

    def test_varlen_cu_seqlens_must_be_int32(self):
        q = np.zeros((4, 2, 8), np.float32)
        cu = np.array([0, 4], np.int64)
        with pytest.raises(TypeError, match=r"cu_seqlens_q\.dtype=int64"):
            flashattn.attention_varlen(q, q, q, cu, cu, 4, 4)

    def test_varlen_non_monotonic(self):
        q = np.zeros((4, 2, 8), np.float32)
        cu = np.array([0, 3, 2], np.int32)
        with pytest.raises(ValueError, match="non-decreasing"):
            flashattn.attention_varlen(q, q, q, cu, cu, 4, 4)

    def test_scale_zero(self):
        with pytest.raises(ValueError, match="scale=0.0"):
            flashattn.attention(*self.inputs(), scale=0.0)

    def test_cuda_backend_name(self):
        with pytest.raises(ValueError, match="not a backend"):
            flashattn.backend_available("tpu")


class TestSdpaOnNumpy:
    """flashattn.sdpa: BHSD and PyTorch's top-left causal mask, on numpy arrays."""

    @pytest.mark.parametrize("seqlen_q,seqlen_k", [(8, 8), (5, 13), (13, 5)])
    def test_top_left_causal(self, seqlen_q, seqlen_k):
        rng = np.random.default_rng(12)
        q, k, v = (np.ascontiguousarray(x.swapaxes(1, 2)) for x in
                   make_inputs(rng, seqlen_q, seqlen_k, np.float32, heads_kv=4))
        out = flashattn.sdpa(q, k, v, is_causal=True)
        assert out.shape == (2, 4, seqlen_q, 16)
        expected = _top_left_causal_reference(q, k, v)
        assert_allclose_report("out", out, expected, atol=2e-6)

    def test_gqa_needs_enable_gqa(self):
        rng = np.random.default_rng(13)
        q, k, v = (np.ascontiguousarray(x.swapaxes(1, 2)) for x in make_inputs(rng, 6, 6, np.float32))
        with pytest.raises(ValueError, match="enable_gqa"):
            flashattn.sdpa(q, k, v)
        out = flashattn.sdpa(q, k, v, enable_gqa=True)
        expected = ref.forward(*(x.swapaxes(1, 2) for x in (q, k, v)))[0].swapaxes(1, 2)
        assert_allclose_report("out", out, expected, atol=2e-6)

    def test_attn_mask_is_rejected(self):
        q = np.zeros((1, 2, 4, 8), np.float32)
        with pytest.raises(ValueError, match="attn_mask is not supported"):
            flashattn.sdpa(q, q, q, attn_mask=np.ones((4, 4), bool))


def _top_left_causal_reference(q, k, v):
    """float64 softmax attention in BHSD with key j visible from query i iff j <= i."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    mask = np.arange(k.shape[2])[None, :] <= np.arange(q.shape[2])[:, None]
    scores = np.where(mask, scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v

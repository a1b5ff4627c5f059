"""PyTorch on the CPU backend: autograd, torch.library registration, torch.compile, flash-attn
compatible functions and flashattn.sdpa against torch.nn.functional.scaled_dot_product_attention.

About float64: the library computes in float32 at most (float64 is rejected with a TypeError), so
torch.autograd.gradcheck cannot run in float64 through it. Instead each gradient is checked two ways:
gradcheck in float32 with a finite-difference step and tolerances sized for float32 (it checks that
the backward is the derivative of the forward, dropout included), and the float32 gradients
against PyTorch's own SDPA, or the float64 numpy reference for features SDPA lacks, computed in
float64 with the project's criterion (error <= 2x a naive float32 implementation's + 1e-6).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
F = torch.nn.functional

import attention_reference as ref  # noqa: E402
import flashattn  # noqa: E402
from checks import assert_allclose_report, assert_close_to_reference  # noqa: E402
from flashattn.compat import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,  # noqa: E402
                              flash_attn_varlen_func)

FLOOR = 1e-6


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def leaf(x):
    return x.detach().clone().requires_grad_(True)


def grads_of(fn, inputs, dout):
    inputs = [leaf(x) for x in inputs]
    out = fn(*inputs)
    out.backward(dout)
    return out.detach(), [x.grad for x in inputs]


def check_against_float64(name, fn32, fn64, inputs, dout):
    """fn32 on float32 inputs vs fn64 on float64 ones (forward and gradients), with a naive
    float32 run of fn64 as the error baseline."""
    out, grads = grads_of(fn32, inputs, dout)
    ref_out, ref_grads = grads_of(fn64, [x.double() for x in inputs], dout.double())
    naive_out, naive_grads = grads_of(fn64, inputs, dout)
    assert_close_to_reference(f"{name} out", out, ref_out, naive_out, FLOOR)
    for i, (g, r, n) in enumerate(zip(grads, ref_grads, naive_grads)):
        assert_close_to_reference(f"{name} grad {i}", g, r, n, FLOOR)


def check_against_numpy_reference(name, fn, inputs, dout, **features):
    out, grads = grads_of(fn, inputs, dout)
    arrays = [x.numpy() for x in inputs]
    assert_close_to_reference(f"{name} out", out, ref.forward(*arrays, **features)[0],
                              ref.forward(*arrays, dtype=np.float32, **features)[0], FLOOR)
    expected = ref.backward(dout.numpy(), *arrays, **features)
    naive = ref.backward(dout.numpy(), *arrays, dtype=np.float32, **features)
    for i, (g, r, n) in enumerate(zip(grads, expected, naive)):
        assert_close_to_reference(f"{name} grad {i}", g, r, n, FLOOR)


def bottom_right_mask(seqlen_q, seqlen_k, window=(-1, -1)):
    return torch.from_numpy(ref.visible(seqlen_q, seqlen_k, window))


def sdpa_bshd(q, k, v, mask=None, scale=None):
    """PyTorch's SDPA on BSHD tensors, GQA by repeating k/v heads."""
    group = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                         scale=scale)
    return out.transpose(1, 2)


class TestSdpa:
    @pytest.mark.parametrize("seqlen_q,seqlen_k", [(16, 16), (7, 23), (23, 7), (1, 9)])
    @pytest.mark.parametrize("is_causal", [False, True])
    def test_matches_torch_in_float64(self, seqlen_q, seqlen_k, is_causal):
        q, k, v = randn(2, 4, seqlen_q, 16, seed=1), randn(2, 4, seqlen_k, 16, seed=2), randn(2, 4, seqlen_k, 16,
                                                                                           seed=3)
        dout = randn(2, 4, seqlen_q, 16, seed=4)
        check_against_float64(f"sdpa causal={is_causal}",
                              lambda q, k, v: flashattn.sdpa(q, k, v, is_causal=is_causal),
                              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
                              [q, k, v], dout)

    def test_gqa_and_scale(self):
        q, k, v = randn(1, 6, 11, 8, seed=5), randn(1, 2, 13, 8, seed=6), randn(1, 2, 13, 8, seed=7)
        dout = randn(1, 6, 11, 8, seed=8)
        check_against_float64("sdpa gqa",
                              lambda q, k, v: flashattn.sdpa(q, k, v, scale=0.3, enable_gqa=True),
                              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True),
                              [q, k, v], dout)

    def test_result_is_a_bhsd_view_of_bshd_memory(self):
        q = randn(2, 4, 8, 16)
        out = flashattn.sdpa(q, q, q)
        assert out.shape == (2, 4, 8, 16) and out.transpose(1, 2).is_contiguous()

    def test_attn_mask_is_rejected(self):
        q = randn(1, 2, 4, 8)
        with pytest.raises(ValueError, match="attn_mask is not supported"):
            flashattn.sdpa(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool))


class TestCompat:
    """flash-attn 2.x semantics: BSHD, causal aligned bottom-right, windows, GQA."""

    @pytest.mark.parametrize("seqlen_q,seqlen_k", [(12, 12), (5, 17), (17, 5)])
    @pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (3, 2)),
                                               (True, (4, 9))])
    def test_flash_attn_func(self, seqlen_q, seqlen_k, causal, window):
        q, k, v = randn(2, seqlen_q, 4, 16, seed=1), randn(2, seqlen_k, 2, 16, seed=2), randn(2, seqlen_k, 2, 16,
                                                                                           seed=3)
        dout = randn(2, seqlen_q, 4, 16, seed=4)
        # flash-attn: causal sets the right window to 0; a side >= seqlen_k is unbounded.
        effective = (window[0] if window[0] < seqlen_k else -1, 0 if causal else window[1])
        mask = bottom_right_mask(seqlen_q, seqlen_k, effective)
        name = f"flash_attn_func causal={causal} window={window}"
        fn = lambda q, k, v: flash_attn_func(q, k, v, causal=causal, window_size=window)  # noqa: E731
        if mask.any(dim=1).all():
            check_against_float64(name, fn, lambda q, k, v: sdpa_bshd(q, k, v, mask), [q, k, v], dout)
        else:  # SDPA turns rows without a visible key into NaN; the numpy reference gives 0 as flash-attn does
            check_against_numpy_reference(name, fn, [q, k, v], dout, window=effective)

    def test_alibi_and_scale(self):
        q, k, v = randn(2, 9, 4, 8, seed=1), randn(2, 14, 4, 8, seed=2), randn(2, 14, 4, 8, seed=3)
        slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
        distance = (torch.arange(9)[:, None] + 14 - 9 - torch.arange(14)[None, :]).abs()
        dout = randn(2, 9, 4, 8, seed=4)

        def with_bias(q, k, v):
            bias = -slopes.to(q.dtype)[:, None, None] * distance.to(q.dtype)
            return sdpa_bshd(q, k, v, bias, scale=0.2)

        check_against_float64("flash_attn_func alibi",
                              lambda q, k, v: flash_attn_func(q, k, v, softmax_scale=0.2, alibi_slopes=slopes),
                              with_bias, [q, k, v], dout)

    def test_softcap_against_numpy_reference(self):
        q, k, v = randn(1, 10, 2, 8, seed=1), randn(1, 10, 2, 8, seed=2), randn(1, 10, 2, 8, seed=3)
        out = flash_attn_func(q, k, v, causal=True, softcap=1.5)
        expected, _ = ref.forward(q.numpy(), k.numpy(), v.numpy(), causal=True, softcap=1.5)
        assert_allclose_report("softcap out", out, expected, atol=2e-6)

    def test_return_attn_probs_gives_lse_and_no_probabilities(self):
        q = randn(2, 6, 4, 8)
        out, lse, s_dmask = flash_attn_func(q, q, q, return_attn_probs=True)
        assert s_dmask is None and lse.shape == (2, 4, 6) and lse.dtype == torch.float32
        expected = torch.logsumexp((q.transpose(1, 2) @ q.permute(0, 2, 3, 1)).double() / 8**0.5, dim=-1)
        assert_allclose_report("lse", lse, expected, atol=1e-5)

    def test_packed_variants_match_the_unpacked_one(self):
        qkv = randn(2, 10, 3, 4, 16, seed=9, dtype=torch.float32)
        dout = randn(2, 10, 4, 16, seed=10)
        out, (dqkv,) = grads_of(lambda qkv: flash_attn_qkvpacked_func(qkv, causal=True), [qkv], dout)
        q, k, v = (leaf(qkv[:, :, i]) for i in range(3))
        expected = flash_attn_func(q, k, v, causal=True)
        expected.backward(dout)
        torch.testing.assert_close(out, expected.detach(), rtol=0, atol=0)
        torch.testing.assert_close(dqkv, torch.stack([q.grad, k.grad, v.grad], dim=2), rtol=0, atol=0)
        kv = qkv[:, :, 1:].contiguous()
        torch.testing.assert_close(flash_attn_kvpacked_func(qkv[:, :, 0], kv, causal=True), expected.detach(),
                                   rtol=0, atol=0)

    def test_strided_last_dimension_is_made_contiguous(self):
        q = randn(1, 4, 2, 16)[..., ::2]
        torch.testing.assert_close(flash_attn_func(q, q, q), flash_attn_func(*(q.contiguous(),) * 3))

    def test_varlen_matches_per_sequence_sdpa(self):
        lengths_q, lengths_k = [3, 0, 12, 1], [5, 4, 12, 9]
        cu_q = torch.tensor(np.cumsum([0] + lengths_q), dtype=torch.int32)
        cu_k = torch.tensor(np.cumsum([0] + lengths_k), dtype=torch.int32)
        q, k, v = randn(16, 4, 8, seed=1), randn(30, 2, 8, seed=2), randn(30, 2, 8, seed=3)
        dout = randn(16, 4, 8, seed=4)

        def per_sequence(q, k, v):
            outs = []
            for b in range(4):
                qs, ks, vs = (x[c[b]:c[b + 1]][None] for x, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
                outs.append(sdpa_bshd(qs, ks, vs, bottom_right_mask(lengths_q[b], lengths_k[b], (-1, 0)))[0])
            return torch.cat(outs)

        check_against_float64("flash_attn_varlen_func",
                              lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 12, causal=True),
                              per_sequence, [q, k, v], dout)

    def test_block_table_is_rejected(self):
        q = randn(4, 2, 8)
        cu = torch.tensor([0, 4], dtype=torch.int32)
        with pytest.raises(ValueError, match="block_table"):
            flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, block_table=torch.zeros(1, 1, dtype=torch.int32))


class TestAutograd:
    # float32 finite differences: step 1e-3 keeps the truncation error (~step^2) and the rounding
    # error (~1e-7 / step) near 1e-4; entries of the Jacobians here are O(1).
    GRADCHECK = {"eps": 1e-3, "atol": 3e-3, "rtol": 3e-3}

    @pytest.mark.parametrize("features", [
        {},
        {"causal": True, "softcap": 2.0},
        {"window": (2, 1), "alibi_slopes": torch.tensor([0.4, 0.2])},
        {"dropout_p": 0.3, "seed": 17, "causal": True},
    ], ids=["plain", "causal_softcap", "window_alibi", "dropout"])
    @pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")  # float32 on purpose, see above
    def test_gradcheck_float32(self, features):
        q, k, v = randn(1, 5, 2, 4, seed=1), randn(1, 6, 1, 4, seed=2), randn(1, 6, 1, 4, seed=3)
        inputs = [leaf(x) for x in (q, k, v)]
        assert torch.autograd.gradcheck(lambda q, k, v: flashattn.attention(q, k, v, **features), inputs,
                                        **self.GRADCHECK)

    def test_gradients_match_the_float64_reference_with_every_feature(self):
        features = {"causal": True, "window": (6, 0), "softcap": 2.5, "alibi_slopes": torch.tensor([0.3, 0.1, 0.2,
                                                                                                    0.05]),
                    "dropout_p": 0.2, "seed": 5}
        q, k, v = randn(2, 13, 4, 16, seed=1), randn(2, 19, 2, 16, seed=2), randn(2, 19, 2, 16, seed=3)
        dout = randn(2, 13, 4, 16, seed=4)
        numpy_features = dict(features, alibi_slopes=features["alibi_slopes"].numpy())
        check_against_numpy_reference("every feature", lambda q, k, v: flashattn.attention(q, k, v, **features),
                                      [q, k, v], dout, **numpy_features)

    def test_drawn_seed_is_reused_by_the_backward(self):
        """With seed=None the forward draws from torch's generator; the backward must use that draw."""
        q, k, v = randn(1, 9, 2, 8, seed=1), randn(1, 9, 2, 8, seed=2), randn(1, 9, 2, 8, seed=3)
        dout = randn(1, 9, 2, 8, seed=4)
        torch.manual_seed(123)
        out, grads = grads_of(lambda q, k, v: flashattn.attention(q, k, v, dropout_p=0.4), [q, k, v], dout)
        torch.manual_seed(123)
        seed = int(torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64))
        expected = ref.backward(dout.numpy(), q.numpy(), k.numpy(), v.numpy(), dropout_p=0.4, seed=seed)
        assert_allclose_report("out", out, ref.forward(q.numpy(), k.numpy(), v.numpy(), dropout_p=0.4,
                                                       seed=seed)[0], atol=1e-5)
        for name, g, r in zip(("dq", "dk", "dv"), grads, expected):
            assert_allclose_report(name, g, r, atol=1e-5)
        torch.manual_seed(124)
        assert not torch.equal(out, flashattn.attention(q, k, v, dropout_p=0.4))

    def test_lse_is_returned_without_gradient(self):
        q = leaf(randn(1, 4, 2, 8))
        out, lse = flashattn.attention(q, q, q, return_lse=True)
        assert out.requires_grad and not lse.requires_grad

    def test_bhsd_views_and_strided_output_gradient(self):
        q, k, v = (leaf(randn(2, 4, 10, 8, seed=i)) for i in range(3))
        out = flashattn.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        out.transpose(1, 2).sum().backward()  # dout arrives with zero strides
        expected_q, expected_k, expected_v = (leaf(x.detach()) for x in (q, k, v))
        F.scaled_dot_product_attention(expected_q, expected_k, expected_v, is_causal=True).sum().backward()
        for name, g, r in (("dq", q.grad, expected_q.grad), ("dk", k.grad, expected_k.grad),
                           ("dv", v.grad, expected_v.grad)):
            assert_allclose_report(name, g, r, atol=2e-5)

    def test_deterministic_backward_is_bitwise_repeatable(self):
        q, k, v = randn(2, 33, 4, 16, seed=1), randn(2, 40, 2, 16, seed=2), randn(2, 40, 2, 16, seed=3)
        dout = randn(2, 33, 4, 16, seed=4)
        runs = [grads_of(lambda q, k, v: flashattn.attention(q, k, v, deterministic=True), [q, k, v], dout)[1]
                for _ in range(2)]
        for a, b in zip(*runs):
            assert torch.equal(a, b)

    def test_explicit_backward_matches_autograd(self):
        q, k, v = randn(1, 7, 2, 8, seed=1), randn(1, 7, 2, 8, seed=2), randn(1, 7, 2, 8, seed=3)
        dout = randn(1, 7, 2, 8, seed=4)
        out, grads = grads_of(lambda q, k, v: flashattn.attention(q, k, v, causal=True), [q, k, v], dout)
        _, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
        explicit = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True)
        for a, b in zip(grads, explicit):
            assert torch.equal(a, b)


class TestLibraryRegistration:
    def test_opcheck(self):
        q, k, v = randn(1, 6, 4, 8, seed=1), randn(1, 7, 2, 8, seed=2), randn(1, 7, 2, 8, seed=3)
        q, k, v = (leaf(x) for x in (q, k, v))
        args = (q, k, v, None, None, None, 0, 0, 0.0, True, -1, -1, 0.0, 0.0, None, False)
        torch.library.opcheck(torch.ops.flashattn.forward.default, args)

    def test_opcheck_varlen_with_dropout(self):
        cu = torch.tensor([0, 3, 8], dtype=torch.int32)
        q, k, v = (leaf(randn(8, 2, 8, seed=i)) for i in range(3))
        seed = torch.tensor([42], dtype=torch.int64)
        args = (q, k, v, None, cu, cu, 5, 5, 0.0, False, 2, 2, 0.0, 0.25, seed, False)
        torch.library.opcheck(torch.ops.flashattn.forward.default, args)


class Block(torch.nn.Module):
    """Attention with a fused qkv projection in BSHD: no transposes on the way to the kernel."""

    def __init__(self, width=32, heads=4, attention=None):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.attention = attention

    def forward(self, x):
        batch, seqlen, width = x.shape
        qkv = self.qkv(x).view(batch, seqlen, 3, self.heads, width // self.heads)
        out = self.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
        return x + self.proj(out.reshape(batch, seqlen, width))


class TestCompile:
    def run_block(self, attention, compile_backend):
        torch.manual_seed(0)
        block = Block(attention=attention)
        x = randn(2, 24, 32, seed=1)
        model = torch.compile(block, fullgraph=True, backend=compile_backend) if compile_backend else block
        out = model(x)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in block.parameters()]

    @pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
    def test_fullgraph_matches_eager(self, compile_backend):
        torch._dynamo.reset()

        def attention(q, k, v):
            return flashattn.attention(q, k, v, causal=True, softcap=4.0)

        eager_out, eager_grads = self.run_block(attention, None)
        out, grads = self.run_block(attention, compile_backend)
        torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-5)
        for g, e in zip(grads, eager_grads):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)

    def test_fullgraph_with_drawn_dropout_seed_and_compat_and_sdpa(self):
        torch._dynamo.reset()

        def attention(q, k, v):
            dropped = flashattn.attention(q, k, v, dropout_p=0.1)
            via_compat = flash_attn_func(q, k, v, causal=True)
            via_sdpa = flashattn.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                      is_causal=True).transpose(1, 2)
            return dropped + via_compat + via_sdpa

        out, grads = self.run_block(attention, "aot_eager")
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)


class TestErrors:
    def test_library_message_through_the_custom_op(self):
        q, k = randn(1, 4, 4, 8), randn(1, 4, 3, 8)
        with pytest.raises(ValueError, match=r"k\.shape\[2\]=3 must divide q\.shape\[2\]=4"):
            flashattn.attention(q, k, k)

    def test_float64_is_a_type_error(self):
        q = randn(1, 4, 2, 8, dtype=torch.float64)
        with pytest.raises(TypeError, match=r"q\.dtype=float64 is not supported"):
            flashattn.attention(q, q, q)

    def test_mismatched_dtypes(self):
        q = randn(1, 4, 2, 8)
        with pytest.raises(TypeError, match=r"k\.dtype=torch\.bfloat16 must match q\.dtype=torch\.float32"):
            flashattn.attention(q, q.bfloat16(), q)

    def test_explicit_backward_with_dropout_needs_the_seed(self):
        q = randn(1, 4, 2, 8)
        out, lse = flashattn.attention(q, q, q, dropout_p=0.5, seed=3, return_lse=True)
        with pytest.raises(ValueError, match="seed"):
            flashattn.attention_backward(q, q, q, q, out, lse, dropout_p=0.5)


def test_bfloat16_on_the_cpu():
    q, k, v = randn(2, 20, 4, 16, seed=1), randn(2, 20, 2, 16, seed=2), randn(2, 20, 2, 16, seed=3)
    out = flashattn.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True)
    assert out.dtype == torch.bfloat16
    expected = sdpa_bshd(*(x.bfloat16().double() for x in (q, k, v)), bottom_right_mask(20, 20, (-1, 0)))
    naive = sdpa_bshd(*(x.bfloat16() for x in (q, k, v)), bottom_right_mask(20, 20, (-1, 0)))
    assert_close_to_reference("bf16 out", out.float(), expected, naive.float(), 1e-4)


def test_training_example_matches_sdpa():
    """python/examples/train_gpt_block.py, shrunk: the same losses with flashattn as with SDPA."""
    path = Path(__file__).resolve().parents[1] / "examples" / "train_gpt_block.py"
    spec = importlib.util.spec_from_file_location("train_gpt_block", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch._dynamo.reset()
    assert example.main(["--device", "cpu", "--steps", "8", "--batch", "2", "--seqlen", "64", "--width", "32",
                         "--heads", "2", "--vocab", "16", "--compile-backend", "aot_eager"]) == 0

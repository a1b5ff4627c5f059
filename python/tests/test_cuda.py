"""PyTorch CUDA tensors on the CUDA backend: skipped without a GPU or without the CUDA backend."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import attention_reference as ref  # noqa: E402
import flashattn  # noqa: E402
from checks import assert_allclose_report, assert_close_to_reference  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if not flashattn.backend_available("cuda"):
    pytest.skip("flashattn was built without the CUDA backend", allow_module_level=True)

DEVICE = "cuda"
FLOOR = 1e-4  # 16-bit outputs


def randn(*shape, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=DEVICE, dtype=torch.float32).to(dtype)


def leaf(x):
    return x.detach().clone().requires_grad_(True)


def mask_of(seqlen_q, seqlen_k, window):
    return torch.from_numpy(ref.visible(seqlen_q, seqlen_k, window)).to(DEVICE)


def naive_attention(q, k, v, mask, scale=None):
    """Attention as plain PyTorch operations in the inputs' dtype (BSHD, GQA by repetition); rows
    that see no key give 0, as the library defines."""
    group = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    seeing = mask.any(dim=-1, keepdim=True)
    probs = scores.masked_fill(~(mask | ~seeing), float("-inf")).softmax(dim=-1) * seeing
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def run(fn, inputs, dout):
    inputs = [leaf(x) for x in inputs]
    out = fn(*inputs)
    out.backward(dout)
    return out.detach(), [x.grad for x in inputs]


def host(x):
    """float64 on the host, for comparisons (exact for every 16- and 32-bit value)."""
    return x.detach().double().cpu()


def to_numpy64(x):
    return host(x).numpy()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlen_q,seqlen_k,window", [(1, 1, (-1, -1)), (17, 17, (-1, 0)), (129, 300, (-1, -1)),
                                                      (300, 129, (-1, 0)), (257, 257, (32, 8))])
def test_forward_backward_against_float64(dtype, head_dim, seqlen_q, seqlen_k, window):
    q, k, v = (randn(2, seqlen_q, 8, head_dim, seed=1, dtype=dtype), randn(2, seqlen_k, 2, head_dim, seed=2,
                                                                             dtype=dtype),
               randn(2, seqlen_k, 2, head_dim, seed=3, dtype=dtype))
    dout = randn(2, seqlen_q, 8, head_dim, seed=4, dtype=dtype)
    mask = mask_of(seqlen_q, seqlen_k, window)
    out, grads = run(lambda q, k, v: flashattn.attention(q, k, v, window=window), [q, k, v], dout)
    ref_out, ref_grads = run(lambda q, k, v: naive_attention(q, k, v, mask), [x.double() for x in (q, k, v)],
                             dout.double())
    naive_out, naive_grads = run(lambda q, k, v: naive_attention(q, k, v, mask), [q, k, v], dout)
    assert out.dtype == dtype and out.is_cuda
    assert_close_to_reference("out", host(out), host(ref_out), host(naive_out), FLOOR)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref_grads, naive_grads):
        assert_close_to_reference(name, host(g), host(r), host(n), FLOOR)


def test_dropout_draws_the_cpu_backends_mask():
    """The same seed gives the same keep mask on both backends, forward and backward."""
    q, k, v = (randn(2, 70, 4, 64, seed=i, dtype=torch.float16) for i in range(3))
    dout = randn(2, 70, 4, 64, seed=4, dtype=torch.float16)
    features = {"dropout_p": 0.3, "seed": 77, "causal": True}
    out, grads = run(lambda q, k, v: flashattn.attention(q, k, v, **features), [q, k, v], dout)
    arrays = [to_numpy64(x).astype("float16") for x in (q, k, v)]
    expected_out, _ = ref.forward(*arrays, **features)
    assert_allclose_report("out", host(out), expected_out, atol=5e-3, rtol=1e-2)
    expected = ref.backward(to_numpy64(dout).astype("float16"), *arrays, **features)
    for name, g, r in zip(("dq", "dk", "dv"), grads, expected):
        assert_allclose_report(name, host(g), r, atol=2e-2, rtol=2e-2)


def test_varlen():
    cu = torch.tensor([0, 100, 100, 357], dtype=torch.int32, device=DEVICE)
    q, k, v = (randn(357, 8, 64, seed=i) for i in range(3))
    out = flashattn.attention_varlen(q, k, v, cu, cu, 257, 257, causal=True)
    for b, (start, stop) in enumerate([(0, 100), (100, 100), (100, 357)]):
        if start == stop:
            continue
        seq = [x[start:stop][None] for x in (q, k, v)]
        mask = mask_of(stop - start, stop - start, (-1, 0))
        expected = naive_attention(*(x.double() for x in seq), mask)
        naive = naive_attention(*seq, mask)
        assert_close_to_reference(f"sequence {b}", host(out[start:stop][None]), host(expected), host(naive),
                                  FLOOR)


def test_runs_on_the_current_stream():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        q, k, v = (randn(4, 1024, 8, 128, seed=i) for i in range(3))  # produced on the side stream
        out = flashattn.attention(q, k, v, causal=True)
        expected = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    side.synchronize()
    assert_allclose_report("out", host(out), host(expected), atol=2e-2)


def test_deterministic_backward_is_bitwise_repeatable():
    q, k, v = (randn(2, 513, 8, 64, seed=i) for i in range(3))
    dout = randn(2, 513, 8, 64, seed=4)
    first = run(lambda q, k, v: flashattn.attention(q, k, v, deterministic=True), [q, k, v], dout)[1]
    second = run(lambda q, k, v: flashattn.attention(q, k, v, deterministic=True), [q, k, v], dout)[1]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_compile_fullgraph_inductor():
    torch._dynamo.reset()

    def layer(x, weight):
        batch, seqlen, width = x.shape
        qkv = (x @ weight).view(batch, seqlen, 3, 8, width // 8)
        return flashattn.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True).reshape(x.shape)

    x = randn(2, 256, 512, seed=1)
    weight = leaf(randn(512, 1536, seed=2) * 0.05)
    eager = layer(x, weight)
    eager.float().square().sum().backward()
    eager_grad, weight.grad = weight.grad, None
    compiled = torch.compile(layer, fullgraph=True)(x, weight)
    compiled.float().square().sum().backward()
    assert_allclose_report("out", host(compiled), host(eager), atol=2e-2)
    assert_allclose_report("grad", host(weight.grad), host(eager_grad), atol=5e-2, rtol=5e-2)


def test_mixed_devices_are_a_value_error():
    q = randn(1, 8, 2, 64)
    with pytest.raises(ValueError, match="is on cpu"):
        flashattn.attention(q, q.cpu(), q)


def test_cupy_arrays_come_back_as_cupy_arrays():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    q, k, v = (randn(2, 40, 4, 64, seed=i, dtype=torch.float16) for i in range(3))
    arrays = [cupy.from_dlpack(x) for x in (q, k, v)]
    torch.cuda.synchronize()
    out = flashattn.attention(*arrays, causal=True)
    assert isinstance(out, cupy.ndarray) and out.dtype == cupy.float16
    cupy.cuda.Device().synchronize()
    expected = flashattn.attention(q, k, v, causal=True)
    assert torch.equal(torch.from_dlpack(out), expected)

"""flashattn's CPU backend beside PyTorch's CPU scaled_dot_product_attention (its own flash kernel), same run.

    python bench/cpu_torch_sdpa.py [--threads 2]

Needs the flashattn package (pip install .) and torch. B=1, H=8, N=4096, float32 (and a bfloat16 row),
FLOP convention of the FlashAttention papers (forward 4*B*H*N^2*d, halved when causal; backward 2.5x
forward)."""
import argparse
import time

import torch
import torch.nn.functional as F

import flashattn


def best(fn, repeats=5):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, flashattn {flashattn.__version__}, {args.threads} threads, on the CPU")
    print(f"{'dtype':>8} {'d':>4} {'causal':>6} | {'ours fwd':>9} {'sdpa fwd':>9} {'ratio':>6} | {'ours f+b':>9} "
          f"{'sdpa f+b':>9} {'ratio':>6}  (GFLOP/s)")
    rows = ((torch.float32, 64, False), (torch.float32, 128, False), (torch.float32, 128, True),
            (torch.bfloat16, 128, False))
    for dtype, d, causal in rows:
        b, h, n = 1, 8, 4096
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        q, k, v = (torch.randn(b, n, h, d, dtype=dtype, requires_grad=True) for _ in range(3))   # BSHD
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))  # BHSD views for SDPA

        def ours():
            with torch.no_grad():
                flashattn.attention(q, k, v, causal=causal)

        def sdpa():
            with torch.no_grad():
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        def ours_fb():
            flashattn.attention(q, k, v, causal=causal).sum().backward()

        def sdpa_fb():
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).sum().backward()

        fo, fs = flops / best(ours) / 1e9, flops / best(sdpa) / 1e9
        bo, bs = 3.5 * flops / best(ours_fb) / 1e9, 3.5 * flops / best(sdpa_fb) / 1e9
        name = str(dtype).removeprefix("torch.")
        print(f"{name:>8} {d:>4} {str(causal):>6} | {fo:9.1f} {fs:9.1f} {fo / fs:6.2f} | {bo:9.1f} {bs:9.1f} {bo / bs:6.2f}")


if __name__ == "__main__":
    main()

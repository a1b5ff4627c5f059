#!/usr/bin/env python3
"""Benchmarks flashattn's CUDA backend against PyTorch's SDPA backends in the same run.

bf16, B * N = 16k tokens, H = 2048 / d, d in {64, 128, 256}, N in {512 .. 16k}, causal and not,
forward and backward. Every implementation reads the same tensors (BHSD memory, which flashattn
takes as strided BSHD views). TFLOP/s use the FlashAttention papers' convention: forward
4 * B * H * N^2 * d, halved when causal; backward 2.5 times the forward. Times are the median of
triton's do_bench (or CUDA events when triton is missing), taken twice per row in mirrored order
(mirrored_medians) and averaged.

With --dropout P every implementation drops with probability P (ours then runs the sm80
kernels, which serve dropout on every GPU, so the sm80 columns are left out).

  python3 bench/bench_cuda.py --library build/libflashattn.so [--quick] [--markdown F] [--jsonl F]
"""
import argparse
import contextlib
import ctypes
import datetime
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# ---- the C API through ctypes (include/flashattn/flashattn.h) -------------------------------

DTYPE_BF16, DEVICE_CUDA, BACKEND_CUDA = 2, 1, 2


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("device", ctypes.c_int),
                ("device_index", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("strides", ctypes.c_int64 * 4)]


class Options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int32),
                ("window_left", ctypes.c_int32), ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float),
                ("alibi_slopes", ctypes.c_void_p), ("dropout_p", ctypes.c_float), ("dropout_seed", ctypes.c_uint64),
                ("dropout_offset", ctypes.c_uint64), ("cu_seqlens_q", ctypes.c_void_p),
                ("cu_seqlens_k", ctypes.c_void_p), ("max_seqlen_q", ctypes.c_int32),
                ("max_seqlen_k", ctypes.c_int32), ("backend", ctypes.c_int), ("deterministic", ctypes.c_int32),
                ("cuda_stream", ctypes.c_void_p), ("workspace", ctypes.c_void_p),
                ("workspace_size", ctypes.c_size_t), ("num_threads", ctypes.c_int32)]


def bshd_view(t):
    """A [B, H, N, d] torch tensor as flashattn's [B, N, H, d] descriptor (no copy)."""
    d = Tensor()
    d.data = t.data_ptr()
    d.dtype = DTYPE_BF16 if t.dtype == torch.bfloat16 else 0
    d.device, d.device_index, d.rank = DEVICE_CUDA, t.device.index or 0, 4
    b, h, n, hd = t.shape
    sb, sh, sn, sd = t.stride()
    d.shape[:] = [b, n, h, hd]
    d.strides[:] = [sb, sn, sh, sd]
    return d


def lse_view(t):
    d = Tensor()
    d.data, d.dtype, d.device, d.device_index, d.rank = t.data_ptr(), 0, DEVICE_CUDA, t.device.index or 0, 3
    d.shape[:3] = list(t.shape)
    d.strides[:3] = list(t.stride())
    return d


class FlashAttn:
    def __init__(self, path, dropout_p=0.0):
        self.lib = ctypes.CDLL(path)
        self.dropout_p = dropout_p
        for name in ("flashattn_forward", "flashattn_backward", "flashattn_forward_workspace_size",
                     "flashattn_backward_workspace_size"):
            getattr(self.lib, name).restype = ctypes.c_int
        self.lib.flashattn_last_error.restype = ctypes.c_char_p

    def options(self, causal, deterministic=False):
        o = Options()
        self.lib.flashattn_options_init(ctypes.byref(o))
        o.causal, o.backend, o.deterministic = int(causal), BACKEND_CUDA, int(deterministic)
        o.dropout_p, o.dropout_seed = self.dropout_p, 7
        o.cuda_stream = torch.cuda.current_stream().cuda_stream
        return o

    def check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: status {status}: {self.lib.flashattn_last_error().decode()}")

    def forward_call(self, q, k, v, out, lse, causal):
        """A closure running out, lse = attention(q, k, v) with a preallocated workspace."""
        o = self.options(causal)
        views = [bshd_view(q), bshd_view(k), bshd_view(v), bshd_view(out), lse_view(lse)]
        refs = [ctypes.byref(x) for x in views]
        size = ctypes.c_size_t()
        self.check(self.lib.flashattn_forward_workspace_size(*refs, ctypes.byref(o), ctypes.byref(size)), "workspace")
        ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
        o.workspace, o.workspace_size = ws.data_ptr(), ws.numel()
        lib, opts = self.lib, ctypes.byref(o)

        def run():
            status = lib.flashattn_forward(*refs, opts)
            if status:
                self.check(status, "flashattn_forward")
        run.keep = (views, ws, o)
        return run

    def backward_call(self, dout, q, k, v, out, lse, dq, dk, dv, causal, deterministic):
        o = self.options(causal, deterministic)
        views = [bshd_view(dout), bshd_view(q), bshd_view(k), bshd_view(v), bshd_view(out), lse_view(lse),
                 bshd_view(dq), bshd_view(dk), bshd_view(dv)]
        refs = [ctypes.byref(x) for x in views]
        size = ctypes.c_size_t()
        self.check(self.lib.flashattn_backward_workspace_size(*refs, ctypes.byref(o), ctypes.byref(size)),
                   "workspace")
        ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
        o.workspace, o.workspace_size = ws.data_ptr(), ws.numel()
        lib, opts = self.lib, ctypes.byref(o)

        def run():
            status = lib.flashattn_backward(*refs, opts)
            if status:
                self.check(status, "flashattn_backward")
        run.keep = (views, ws, o)
        return run


def library_commit(library):
    """The commit the library was built from: its build folder's CMake source tree, when that is
    the top of a git checkout ('+changes' if it differs from the commit), or a tree exported with
    `git archive` (which writes the commit into cmake/source_commit.txt); otherwise 'unknown' (a
    build folder without a CMake cache, or a tree copied some other way)."""
    cache = os.path.join(os.path.dirname(os.path.abspath(library)), "CMakeCache.txt")
    try:
        source = next(line.split("=", 1)[1].strip() for line in open(cache)
                      if line.startswith("CMAKE_HOME_DIRECTORY:"))
    except (OSError, StopIteration):
        return "unknown"
    git = lambda *a: subprocess.run(["git", "-C", source, *a], capture_output=True, text=True).stdout.strip()
    if os.path.realpath(git("rev-parse", "--show-toplevel") or "/nonexistent") == os.path.realpath(source):
        changed = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+changes" if changed else "")
    try:
        exported = open(os.path.join(source, "cmake", "source_commit.txt")).read().strip()
    except OSError:
        return "unknown"
    return exported + " (exported)" if exported and not exported.startswith("$Format") else "unknown"


# ---- timing --------------------------------------------------------------------------------

def median_ms(fn):
    try:
        from triton.testing import do_bench
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    except ImportError:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(5):
            fn()
        times = []
        for _ in range(20):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]


def flops(b, h, n, d, causal, backward):
    f = 4.0 * b * h * n * n * d / (2 if causal else 1)
    return f * (2.5 if backward else 1.0)


def mirrored_medians(groups):
    """{name: ms} for groups of (context, [(name, closure)]): every closure timed twice, the groups
    in order and then in reverse order (the closures of a group too), and the mean of its two medians.

    Under the GPU's power limit the clocks drift during a row (seconds of full load), so whatever
    is timed later in a row runs at other clocks than what is timed first; the mirrored second
    round gives every closure one early and one late place, and ratios within a row compare
    like with like."""
    times = {}
    for round_groups in (groups, [(context, items[::-1]) for context, items in groups[::-1]]):
        for context, items in round_groups:
            with context():
                for name, fn in items:
                    times.setdefault(name, []).append(median_ms(fn))
    return {name: sum(t) / len(t) for name, t in times.items()}


@contextlib.contextmanager
def sm80_kernels():
    """The library's mma.sync (sm80) kernels instead of the sm_90a ones, while the context lasts
    (then the caller's choice again, if it made one)."""
    previous = os.environ.get("FLASHATTN_CUDA_KERNELS")
    os.environ["FLASHATTN_CUDA_KERNELS"] = "sm80"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["FLASHATTN_CUDA_KERNELS"]
        else:
            os.environ["FLASHATTN_CUDA_KERNELS"] = previous


def sdpa_group(name, backend, q, k, v, dout, causal, backward, dropout_p):
    """(group for mirrored_medians, output) of torch SDPA with one backend, or None if it refuses."""
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    context = lambda: sdpa_kernel([backend])
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    try:
        with context():
            out = sdpa(qg, kg, vg)
    except RuntimeError as e:
        print(f"  {backend}: {str(e).splitlines()[0]}", file=sys.stderr)
        return None
    items = [(f"{name}_fwd", lambda: sdpa(q, k, v))]
    if backward:
        items.append((f"{name}_bwd", lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)))
    return (context, items), out.detach()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--library", required=True, help="path to libflashattn.so built with CUDA")
    ap.add_argument("--quick", action="store_true", help="N in {1k, 4k, 16k} only")
    ap.add_argument("--seqlens", help="comma-separated N instead of the default (or --quick) list")
    ap.add_argument("--forward-only", action="store_true", help="skip the backward measurements")
    ap.add_argument("--no-sm80", action="store_true", help="skip the mma.sync kernels' measurements")
    ap.add_argument("--ours-only", action="store_true",
                    help="skip PyTorch's SDPA and the sm80 kernels (to compare builds, or det/default)")
    ap.add_argument("--head-dims", default="64,128,256", help="comma-separated head dims (default 64,128,256)")
    ap.add_argument("--masks", choices=("both", "causal", "none"), default="both",
                    help="rows with a causal mask, without, or both (default)")
    ap.add_argument("--long", action="store_true",
                    help="long-context rows instead: B=1, H=16, d=128, causal, N = 64k, 128k, 256k")
    ap.add_argument("--dropout", type=float, default=0.0, metavar="P",
                    help="dropout probability for every implementation (default 0)")
    ap.add_argument("--markdown", help="write the table here as well")
    ap.add_argument("--jsonl", help="one JSON object per measurement")
    args = ap.parse_args()

    if not 0.0 <= args.dropout < 1.0:
        ap.error(f"--dropout must be in [0, 1), got {args.dropout}")
    fa = FlashAttn(args.library, args.dropout)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    lengths = [1024, 4096, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    if args.seqlens:
        lengths = [int(n) for n in args.seqlens.split(",")]
    shapes = [(16384 // n, 2048 // d, n, d, causal) for d in map(int, args.head_dims.split(",")) for n in lengths
              for causal in {"both": (False, True), "causal": (True,), "none": (False,)}[args.masks]]
    if args.long:
        shapes = [(1, 16, n, 128, True) for n in (65536, 131072, 262144)]
    rows, records = [], []
    for b, heads, n, d, causal in shapes:
        q, k, v, dout = (torch.randn(b, heads, n, d, device=dev, dtype=torch.bfloat16) for _ in range(4))
        out = torch.empty_like(q)
        lse = torch.empty(b, heads, n, device=dev, dtype=torch.float32)
        dq, dk, dv = (torch.empty_like(q) for _ in range(3))
        ours_fwd = fa.forward_call(q, k, v, out, lse, causal)
        ours_fwd()
        backward = not args.forward_only
        # Each group: a context to time it in and its (name, closure) pairs.
        groups = [(contextlib.nullcontext, [("ours_fwd", ours_fwd)] + ([
            ("ours_bwd", fa.backward_call(dout, q, k, v, out, lse, dq, dk, dv, causal, False)),
            ("ours_bwd_det", fa.backward_call(dout, q, k, v, out, lse, dq, dk, dv, causal, True))] if backward else []))]
        # The mma.sync (sm80) kernels too, where the sm_90a ones serve by default (not for the
        # long rows, where they would take most of the run, nor with --no-sm80).
        if not args.long and not args.no_sm80 and not args.ours_only and not args.dropout:
            with sm80_kernels():  # the workspace sizes are the sm80 kernels' too
                groups.append((sm80_kernels, [("sm80_fwd", fa.forward_call(q, k, v, out, lse, causal))] + (
                    [("sm80_bwd", fa.backward_call(dout, q, k, v, out, lse, dq, dk, dv, causal, False)),
                     ("sm80_bwd_det", fa.backward_call(dout, q, k, v, out, lse, dq, dk, dv, causal, True))]
                    if backward else [])))
        ref = None
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            if args.ours_only:
                break
            r = sdpa_group(name, backend, q, k, v, dout, causal, backward, args.dropout)
            if r:
                groups.append(r[0])
                ref = r[1] if ref is None else ref
        ms = mirrored_medians(groups)
        ours_fwd()  # out and lse of the default kernels, compared below
        # (Under dropout each implementation drops other elements: no comparison.)
        compare = ref is not None and not args.dropout
        err = (out.float() - ref.float()).abs().max().item() if compare else float("nan")
        fl_f, fl_b = flops(b, heads, n, d, causal, False), flops(b, heads, n, d, causal, True)
        tf = lambda fl, t: fl / (t * 1e-3) / 1e12 if t else float("nan")
        row = dict(d=d, n=n, batch=b, heads=heads, causal=causal, max_abs_diff_vs_sdpa=err)
        for name in ("ours_fwd", "ours_bwd", "ours_bwd_det", "sm80_fwd", "sm80_bwd", "sm80_bwd_det", "flash_fwd",
                     "flash_bwd", "cudnn_fwd", "cudnn_bwd"):
            row[name] = tf(fl_b if "bwd" in name else fl_f, ms.get(name))
        # One training step of the layer, forward + backward, against cuDNN's.
        both = lambda impl: ms[f"{impl}_fwd"] + ms[f"{impl}_bwd"] if f"{impl}_bwd" in ms and f"{impl}_fwd" in ms else None
        row["ours_step"], row["cudnn_step"] = tf(fl_f + fl_b, both("ours")), tf(fl_f + fl_b, both("cudnn"))
        rows.append(row)
        records.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, dout, out, lse, dq, dk, dv, ours_fwd, groups, ref
        torch.cuda.empty_cache()

    commit = library_commit(args.library)
    lines = [f"{datetime.date.today()} · {torch.cuda.get_device_name()} · torch {torch.__version__} · "
             f"cuDNN {torch.backends.cudnn.version()} · commit {commit} · bf16, B·N = 16k, H = 2048/d"
             + (f", dropout {args.dropout}" if args.dropout else ""),
             "",
             "| B | H | d | N | causal | ours fwd | sm80 fwd | FLASH fwd | cuDNN fwd | ours/cuDNN | sm80/FLASH "
             "| ours bwd | sm80 bwd | det bwd | sm80 det | FLASH bwd | cuDNN bwd | ours/cuDNN | sm80/FLASH "
             "| det/default | sm80 det/default | fwd+bwd ours/cuDNN |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratio = lambda a, b: f"{a / b:.2f}" if a == a and b == b and b else "-"
    num = lambda x: f"{x:.0f}" if x == x else "-"
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['heads']} | {r['d']} | {r['n']} | {'yes' if r['causal'] else 'no'} "
            f"| {num(r['ours_fwd'])} | {num(r['sm80_fwd'])} | {num(r['flash_fwd'])} "
            f"| {num(r['cudnn_fwd'])} | {ratio(r['ours_fwd'], r['cudnn_fwd'])} | {ratio(r['sm80_fwd'], r['flash_fwd'])} "
            f"| {num(r['ours_bwd'])} | {num(r['sm80_bwd'])} | {num(r['ours_bwd_det'])} | {num(r['sm80_bwd_det'])} "
            f"| {num(r['flash_bwd'])} | {num(r['cudnn_bwd'])} | {ratio(r['ours_bwd'], r['cudnn_bwd'])} "
            f"| {ratio(r['sm80_bwd'], r['flash_bwd'])} | {ratio(r['ours_bwd_det'], r['ours_bwd'])} "
            f"| {ratio(r['sm80_bwd_det'], r['sm80_bwd'])} | {ratio(r['ours_step'], r['cudnn_step'])} |")
    table = "\n".join(lines) + ("\n\nTFLOP/s (forward 4·B·H·N²·d, halved when causal; backward 2.5×). "
                                 "ours = the kernels the library picks (sm_90a on Hopper; dropout runs on sm80); "
                                 "sm80 = the mma.sync kernels, FLASHATTN_CUDA_KERNELS=sm80; det = deterministic; "
                                 "fwd+bwd = one forward and one backward. Each figure: the mean of two medians, "
                                 "one timed in the row's order and one in the reverse order.\n")
    print(table)
    if args.markdown:
        open(args.markdown, "w").write(table)
    if args.jsonl:
        with open(args.jsonl, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

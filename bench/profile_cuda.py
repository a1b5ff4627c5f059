#!/usr/bin/env python3
"""Runs one shape through flashattn's CUDA kernels and PyTorch's FLASH (FlashAttention-2) and/or
cuDNN SDPA backends (--reference flash | cudnn | both) once each, for a profiler to compare them
kernel by kernel; with --ncu it runs itself under Nsight Compute and prints one table: a row per
metric, a column per kernel. With --sass DIR it samples the warps of our first forward or
backward kernel (--pass) instead, writes Nsight Compute's per-instruction table to
DIR/<pass>_<sm90|sm80>_d<d>_n<n>.csv and prints the instructions where the warps stall most,
with their reasons. With --kernel-times it prints each call's kernels as torch.profiler times them.
With --clocks it runs each call back to back for a few seconds while nvidia-smi samples the GPU,
and prints each one's sustained rate beside the SM clock and the power it ran at: a kernel that
draws more power runs at a lower clock under the board's power limit, which Nsight Compute (at
fixed base clocks) does not show.

  python3 bench/profile_cuda.py --library build/libflashattn.so --d 64 --n 4096 [--causal] [--deterministic] --ncu
  python3 bench/profile_cuda.py --library build/libflashattn.so --d 128 --n 1024 --sass out --pass forward
  python3 bench/profile_cuda.py --library build/libflashattn.so --d 128 --n 2048 --reference cudnn --kernel-times
  python3 bench/profile_cuda.py --library build/libflashattn.so --d 256 --n 4096 --reference both --clocks

bf16, B * N = 16k tokens, H = 2048 / d as in bench_cuda.py. FLASHATTN_CUDA_KERNELS=sm80 in the
environment profiles the mma.sync kernels on a Hopper GPU.
"""
import argparse
import csv
import io
import os
import subprocess
import sys

METRICS = [
    "gpu__time_duration.sum",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_registers",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sectors.sum",
    "lts__t_sectors_op_read.sum",
    "lts__t_sector_hit_rate.pct",
    "lts__t_sectors_op_red.sum",
    "dram__bytes_read.sum",
] + [f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in (
    "barrier", "long_scoreboard", "short_scoreboard", "mio_throttle", "math_pipe_throttle", "wait",
    "not_selected", "dispatch_stall", "lg_throttle", "membar", "branch_resolving", "no_instruction")]
# Ours (sm90/sm80 forward and backward, the d = 256 sm90 backward), FlashAttention-2's and cuDNN's.
KERNELS = "regex:forward_kernel|backward_kernel|flash_fwd_kernel|flash_bwd_dq_dk_dv|sdpa"


def shape_calls(args):
    """(name, closure) for our forward and backward and each reference's, on one shape's tensors."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from bench_cuda import FlashAttn

    fa = FlashAttn(args.library, args.dropout)
    h = 2048 // args.d
    b = max(1, 16384 // args.n)
    shape = (b, h, args.n, args.d)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty((b, h, args.n), device="cuda", dtype=torch.float32)
    calls = [("ours forward", fa.forward_call(q, k, v, out, lse, args.causal)),
             ("ours backward", fa.backward_call(dout, q, k, v, out, lse, dq, dk, dv, args.causal, False))]
    if args.deterministic:
        calls.append(("ours deterministic backward",
                      fa.backward_call(dout, q, k, v, out, lse, dq, dk, dv, args.causal, True)))
    backends = {"flash": [SDPBackend.FLASH_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION],
                "both": [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]}[args.reference]
    for backend in backends:
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel([backend]):
            ref = F.scaled_dot_product_attention(qg, kg, vg, dropout_p=args.dropout, is_causal=args.causal)

        def forward(backend=backend):
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, v, dropout_p=args.dropout, is_causal=args.causal)

        def backward(ref=ref, inputs=(qg, kg, vg)):
            torch.autograd.grad(ref, inputs, dout, retain_graph=True)
        name = backend.name.split("_")[0].lower()
        calls += [(f"{name} forward", forward), (f"{name} backward", backward)]
    return calls


def run_shape(args):
    """Each kernel once, for a profiler: the references' forwards ran already, building the graphs
    of their backwards."""
    import torch
    for name, call in shape_calls(args):
        if name.startswith("ours") or name.endswith("backward"):
            call()
    torch.cuda.synchronize()


def kernel_times(args, reps=20):
    """Each call's kernels under torch.profiler: µs per call for each kernel, their sum, and the
    call's elapsed time between CUDA events (the difference is the GPU idle between kernels)."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile
    print(f"d = {args.d}, N = {args.n}, {'causal' if args.causal else 'non-causal'}, B = {max(1, 16384 // args.n)}, "
          f"H = {2048 // args.d}; µs per call, mean of {reps}")
    for name, call in shape_calls(args):
        for _ in range(3):
            call()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            start.record()
            for _ in range(reps):
                call()
            end.record()
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name] = kernels.get(e.name, 0.0) + e.time_range.elapsed_us() / reps
        print(f"{name}: elapsed {1000 * start.elapsed_time(end) / reps:.1f}, kernels {sum(kernels.values()):.1f}")
        for kernel, us in sorted(kernels.items(), key=lambda x: -x[1]):
            print(f"  {us:9.1f}  {kernel[:110]}")


# nvidia-smi's clock event reasons (the bits of clocks_event_reasons.active that lower clocks).
CLOCK_REASONS = {0x4: "power cap", 0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "power brake"}


def parse_clock_samples(output):
    """[(SM MHz, W, C, reason bits)] from nvidia-smi's CSV lines of clocks.sm, power.draw,
    temperature.gpu and clocks_event_reasons.active; lines that are not samples are skipped."""
    samples = []
    for line in output.splitlines():
        fields = [x.strip() for x in line.split(",")]
        try:
            samples.append((float(fields[0]), float(fields[1]), float(fields[2]), int(fields[3], 16)))
        except (ValueError, IndexError):
            pass
    return samples


def clock_reasons(samples):
    """What held the clock down in any of the samples, in words."""
    held = 0
    for s in samples:
        held |= s[3]
    return ", ".join(v for bit, v in CLOCK_REASONS.items() if held & bit) or "nothing"


def sustained_clocks(args, warm_seconds=1.0, seconds=2.5, period_ms=50):
    """Each call back to back: after `warm_seconds`, nvidia-smi samples the SM clock, power,
    temperature and the reasons the clock is held down every `period_ms` while the calls go on
    for `seconds`; prints the call's TFLOP/s (bench_cuda.py's convention) beside the samples'
    means."""
    import time
    import torch
    from bench_cuda import flops
    b, h = max(1, 16384 // args.n), 2048 // args.d
    smi = ["nvidia-smi", "--format=csv,noheader,nounits"]
    limits = subprocess.run(smi + ["--query-gpu=enforced.power.limit,clocks.max.sm"], capture_output=True, text=True)
    print(f"d = {args.d}, N = {args.n}, {'causal' if args.causal else 'non-causal'}, B = {b}, H = {h}; "
          f"sustained over {seconds} s after {warm_seconds} s of warm-up; power limit (W), max SM clock (MHz): "
          f"{limits.stdout.strip() or limits.stderr.strip()}")
    print("| call | TFLOP/s | SM clock (MHz) | power (W) | temperature (C) | clock held by | samples |")
    print("|---|---|---|---|---|---|---|")
    query = smi + ["--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active", f"-lms={period_ms}"]

    def run_for(call, duration):
        """Calls `call` back to back for `duration` seconds (a few queued at a time); how many."""
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < duration:
            call()
            calls += 1
            if calls % 8 == 0:
                torch.cuda.synchronize()
        return calls

    for name, call in shape_calls(args):
        run_for(call, warm_seconds)
        torch.cuda.synchronize()
        sampler = subprocess.Popen(query, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(0.2)  # nvidia-smi's start-up, so that every sample falls under load
        start = time.perf_counter()
        calls = run_for(call, seconds)
        sampler.terminate()  # before the queue drains
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        output = sampler.communicate()[0]
        samples = parse_clock_samples(output)
        if not samples:
            print(f"| {name} | nvidia-smi gave no samples: {output.strip()[:200]} |")
            continue
        mean = lambda i: sum(s[i] for s in samples) / len(samples)
        reasons = clock_reasons(samples)
        rate = calls * flops(b, h, args.n, args.d, args.causal, name.endswith("backward")) / elapsed / 1e12
        print(f"| {name} | {rate:.0f} | {mean(0):.0f} | {mean(1):.0f} | {mean(2):.0f} | {reasons} | {len(samples)} |")


def shape_command(args):
    """This script, run on the same shape and library: what ncu profiles."""
    return ([sys.executable, os.path.abspath(__file__), "--library", args.library, "--d", str(args.d), "--n",
             str(args.n), "--reference", args.reference, "--dropout", str(args.dropout)]
            + (["--causal"] if args.causal else []) + (["--deterministic"] if args.deterministic else []))


def profile(args):
    cmd = ["ncu", "--csv", "--page", "raw", "-k", KERNELS, "--metrics", ",".join(METRICS)] + shape_command(args)
    result = subprocess.run(cmd, capture_output=True, text=True)
    text = result.stdout
    if '"ID"' not in text:
        sys.exit("ncu printed no metrics table:\n" + text[-2000:] + result.stderr[-2000:])
    rows = list(csv.DictReader(io.StringIO(text[text.index('"ID"'):])))[1:]  # row 0: units
    names = [r["Kernel Name"].split("(")[0].split("<")[0].split("::")[-1][:28] for r in rows]
    print("| metric | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(rows))
    for m in METRICS:
        print(f"| {m.replace('smsp__average_warps_issue_stalled_', 'stall ').replace('_per_issue_active.ratio', '')} | "
              + " | ".join(r.get(m, "-") for r in rows) + " |")


def sample_sass(args):
    """Warp-state sampling of one of our kernels, per SASS instruction."""
    os.makedirs(args.sass, exist_ok=True)
    namespace = "sm80" if os.environ.get("FLASHATTN_CUDA_KERNELS") == "sm80" else "sm90"
    wide = "(wide_)?" if namespace == "sm90" and args.pass_ == "backward" else ""  # d = 256 has its own
    kernel = f"regex:flashattn::cuda::{'sm90::' if namespace == 'sm90' else ''}{wide}{args.pass_}_kernel"
    report = os.path.join(args.sass, f"{args.pass_}_{namespace}_d{args.d}_n{args.n}")
    subprocess.run(["ncu", "-f", "--kernel-name-base", "demangled", "-k", kernel, "--launch-count", "1",
                    "--section", "SourceCounters", "--section", "WarpStateStats", "-o", report] + shape_command(args),
                   check=True)
    export = ["ncu", "-i", report + ".ncu-rep", "--page", "source", "--csv"]
    result = subprocess.run(export + ["--print-source", "sass"], capture_output=True, text=True)
    if result.returncode != 0:  # older Nsight Compute: SASS is the source page's default view
        result = subprocess.run(export, capture_output=True, text=True, check=True)
    table = result.stdout
    with open(report + ".csv", "w") as f:
        f.write(table)
    summarise_sass(report + ".csv", args.top)


def summarise_sass(path, top):
    """Prints the `top` instructions of a per-instruction table with the most warp samples."""
    with open(path) as f:
        table = f.read()
    rows = list(csv.DictReader(io.StringIO(table[table.index('"Address"'):])))
    samples = "Warp Stall Sampling (All Samples)"
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    number = lambda x: float(x.replace(",", "")) if x and x.replace(",", "").replace(".", "").isdigit() else 0.0
    total = sum(number(r[samples]) for r in rows) or 1.0
    by_reason = {c: sum(number(r[c]) for r in rows) for c in reasons}
    print(f"{path}: {len(rows)} instructions, {total:.0f} samples; "
          + ", ".join(f"{c[6:]} {100 * v / total:.0f}%" for c, v in sorted(by_reason.items(), key=lambda x: -x[1])[:8]))
    for r in sorted(rows, key=lambda r: -number(r[samples]))[:top]:
        worst = sorted(((number(r[c]), c[6:]) for c in reasons), reverse=True)[:3]
        print(f"{100 * number(r[samples]) / total:5.2f}%  {r['Address']}  {r['Source'][:64]:64}  "
              + ", ".join(f"{c} {v:.0f}" for v, c in worst if v > 0))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--library", required=True)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--deterministic", action="store_true", help="our deterministic backward too")
    ap.add_argument("--dropout", type=float, default=0.0, metavar="P", help="dropout probability (default 0)")
    ap.add_argument("--reference", choices=["flash", "cudnn", "both"], default="flash",
                    help="PyTorch SDPA backend(s) profiled beside ours")
    ap.add_argument("--ncu", action="store_true", help="run under Nsight Compute and print the metrics")
    ap.add_argument("--sass", metavar="DIR", help="sample our kernel's warps per SASS instruction into DIR")
    ap.add_argument("--pass", dest="pass_", choices=["forward", "backward"], default="forward")
    ap.add_argument("--top", type=int, default=40, help="instructions printed with --sass")
    ap.add_argument("--kernel-times", action="store_true",
                    help="each call's kernels under torch.profiler, in µs per call")
    ap.add_argument("--clocks", action="store_true",
                    help="each call back to back: its sustained TFLOP/s, SM clock and power")
    args = ap.parse_args()
    if args.sass:
        sample_sass(args)
    elif args.ncu:
        profile(args)
    elif args.kernel_times:
        kernel_times(args)
    elif args.clocks:
        sustained_clocks(args)
    else:
        run_shape(args)


if __name__ == "__main__":
    main()

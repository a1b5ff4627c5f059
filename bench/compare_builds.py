"""Benchmarks several builds of flashattn in one run on one GPU, side by side.

    python bench/compare_builds.py OUT SOURCE [SOURCE ...] [--head-dims 64,128] [--full | --seqlens N,...]
        [--forward-only] [--no-sm80] [--masks causal|none] [--rounds R] [--tests | --check] [--check-first]
        [--clocks D:N[:causal] ...] [--clocks-reference cudnn|flash|both]

Each SOURCE is a source tree (a folder with CMakeLists.txt) or a git ref of this repository,
exported with `git archive` (this checkout's third_party linked in: GoogleTest's source for the
tests where the machine has no GoogleTest). All are built at once into OUT/<name>/build (the
head dims measured; CUDA architectures from FLASHATTN_CUDA_ARCHS, default 90; with --tests the
CUDA test binary too, OUT/<name>/build/tests/cuda/flashattn_cuda_tests; with --check that binary
also runs, whole and under compute-sanitizer memcheck, racecheck and synccheck on a subset, the
builds' checks side by side, before the benchmarks, and a line per build says how each check
went). The first SOURCE is the reference the others are measured against, as a rule the landed
code, which passed its checks when it landed: --tests and --check leave it out unless
--check-first. Then the builds are measured one after the other with bench/bench_cuda.py
(--quick unless --full or --seqlens; --forward-only, --no-sm80 and --masks passed on). --rounds R
measures them R times, round after round (A B A B rather than A A B B, so that a drift of the
machine's clocks falls on every build alike). The tables land in OUT/<name>/bench-<round>.md and
a side-by-side table of the forward, backward and deterministic backward of every build,
averaged over the rounds, with cuDNN's from the first build's runs and each later build's gain
over the first, is printed at the end. Kernel variants are compared within one run of one
machine, as the figures of docs/performance.md are. --clocks D:N (or D:N:causal, repeatable) then
runs each build's kernels on that shape back to back under bench/profile_cuda.py --clocks (with
the reference backend beside them): each build's sustained rate, SM clock and power, which tell a
change that saves energy from one that only saves cycles when the GPU runs at its power cap.
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --check: the sanitizers' filters (scripts/sanitizer_filters.sh, shared with gpu_check.sh) and a
# time limit per check that turns a hang into a failure.
CHECK_SECONDS = 300


def run(cmd, log):
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode == 0


def source_tree(source, out):
    """The folder of SOURCE's sources: SOURCE itself, or the ref exported into OUT/<name>/src."""
    if os.path.isfile(os.path.join(source, "CMakeLists.txt")):
        return os.path.basename(os.path.normpath(source)), os.path.abspath(source)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", source)
    dest = os.path.join(out, name, "src")
    os.makedirs(dest, exist_ok=True)
    archive = subprocess.run(["git", "-C", ROOT, "archive", source], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    # Untracked sources the build takes from this checkout (third_party: GoogleTest's source on
    # machines without the package, the Python build's wheels).
    third_party = os.path.join(ROOT, "third_party")
    if os.path.isdir(third_party) and not os.path.exists(os.path.join(dest, "third_party")):
        os.symlink(third_party, os.path.join(dest, "third_party"))
    return name, dest


def build(src, build_dir, head_dims, tests, jobs, log):
    archs = os.environ.get("FLASHATTN_CUDA_ARCHS", "90")
    configure = ["cmake", "-S", src, "-B", build_dir, "-G", "Ninja", "-DFLASHATTN_CUDA=ON",
                 f"-DFLASHATTN_CUDA_ARCHS={archs}", f"-DFLASHATTN_HEAD_DIMS={head_dims.replace(',', ';')}",
                 f"-DFLASHATTN_BUILD_TESTS={'ON' if tests else 'OFF'}", "-DFLASHATTN_BUILD_CLI=OFF",
                 "-DFLASHATTN_BUILD_PYTHON=OFF"]
    targets = ["flashattn"] + (["flashattn_cuda_tests"] if tests else [])
    return run(configure, log) and run(["cmake", "--build", build_dir, "-j", str(jobs), "--target", *targets], log)


def sanitizer_filter(tool):
    """The filter of `tool` in scripts/sanitizer_filters.sh."""
    script = os.path.join(ROOT, "scripts", "sanitizer_filters.sh")
    return subprocess.run(["bash", "-c", f'source "{script}" && echo "$SANITIZER_{tool.upper()}"'],
                          capture_output=True, text=True, check=True).stdout.strip()


def check(folder, log):
    """Runs the build's CUDA tests, then memcheck, racecheck and synccheck on their filters: 'name ok/FAILED' each."""
    binary = os.path.join(folder, "build", "tests", "cuda", "flashattn_cuda_tests")
    checks = [("tests", [binary, "--gtest_brief=1"])] + [
        (tool, ["compute-sanitizer", "--tool", tool, "--error-exitcode", "1", binary,
                f"--gtest_filter={sanitizer_filter(tool)}"])
        for tool in ("memcheck", "racecheck", "synccheck")]
    verdicts = []
    for name, cmd in checks:
        try:
            ok = run(["timeout", str(CHECK_SECONDS)] + cmd, log)
        except FileNotFoundError:
            ok = False
        verdicts.append(f"{name} {'ok' if ok else 'FAILED'}")
    return ", ".join(verdicts)


def clock_shape(spec):
    """(d, n, causal) of a --clocks shape, D:N or D:N:causal (argparse's type for it)."""
    parts = spec.split(":")
    if (len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2])
            or (len(parts) == 3 and parts[2] != "causal")):
        raise argparse.ArgumentTypeError(f"expected D:N or D:N:causal, not {spec!r}")
    return int(parts[0]), int(parts[1]), len(parts) == 3


def clocks_command(shape, library, reference):
    """bench/profile_cuda.py --clocks on `shape` (clock_shape's) with `library`."""
    d, n, causal = shape
    return ([sys.executable, os.path.join(ROOT, "bench", "profile_cuda.py"), "--library", library,
             "--d", str(d), "--n", str(n), "--reference", reference, "--clocks"] + (["--causal"] if causal else []))


def tested_sources(count, tests, check_first):
    """Which of `count` sources get their tests built (and, with --check, run): all but the
    first, the reference, unless check_first."""
    return [tests and (i > 0 or check_first) for i in range(count)]


def measured(x):
    return x is not None and x == x  # neither missing nor NaN


def average_rounds(rounds):
    """{(d, n, causal): row} with every figure the mean of the rounds that measured it."""
    averaged = {}
    for key, first in rounds[0].items():
        row = dict(first)
        for field, value in first.items():
            if isinstance(value, float):
                values = [r[key][field] for r in rounds if key in r and measured(r[key].get(field))]
                row[field] = sum(values) / len(values) if values else float("nan")
        averaged[key] = row
    return averaged


def side_by_side(results):
    """Markdown table of [(name, {(d, n, causal): row})]: the references from the first build's
    runs, every build's figures, and each later build's gain over the first."""
    num = lambda x: f"{x:.0f}" if measured(x) else "-"
    # The kernels the library picks (ours), and the mma.sync ones where the machine has sm_90a ones.
    columns = [c for c in ("ours_fwd", "ours_bwd", "ours_bwd_det", "sm80_fwd", "sm80_bwd", "sm80_bwd_det")
               if any(measured(r.get(c)) for _, rows in results for r in rows.values())]
    label = lambda c: c.replace("ours_", "").replace("_", " ")
    head = ["d", "N", "causal", "cuDNN fwd", "cuDNN bwd", "FLASH fwd", "FLASH bwd"]
    head += [f"{name} {label(c)}" for name, _ in results for c in columns]
    head += [f"{name}/{results[0][0]} {label(c)}" for name, _ in results[1:] for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, first in results[0][1].items():
        d, n, causal = key
        cells = [str(d), str(n), "yes" if causal else "no"]
        cells += [num(first.get(c)) for c in ("cudnn_fwd", "cudnn_bwd", "flash_fwd", "flash_bwd")]
        for _, rows in results:
            cells += [num(rows.get(key, {}).get(c)) for c in columns]
        for _, rows in results[1:]:
            for c in columns:
                a, b = first.get(c), rows.get(key, {}).get(c)
                cells.append(f"{100 * (b / a - 1):+.1f}%" if measured(a) and measured(b) and a else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--full", action="store_true", help="every N of bench_cuda.py, not --quick")
    ap.add_argument("--seqlens", help="comma-separated N for bench_cuda.py instead of --quick")
    ap.add_argument("--forward-only", action="store_true", help="skip the backward measurements")
    ap.add_argument("--no-sm80", action="store_true", help="skip the mma.sync kernels' measurements")
    ap.add_argument("--masks", choices=("both", "causal", "none"), default="both",
                    help="rows with a causal mask, without, or both (default)")
    ap.add_argument("--rounds", type=int, default=1, help="measure every build this many times, interleaved")
    ap.add_argument("--tests", action="store_true",
                    help="build each source's CUDA test binary too (the first's with --check-first)")
    ap.add_argument("--check", action="store_true",
                    help="build and run each source's CUDA tests, and memcheck, racecheck and synccheck on a subset")
    ap.add_argument("--check-first", action="store_true", help="--tests and --check the first source too")
    ap.add_argument("--clocks", type=clock_shape, action="append", default=[], metavar="D:N[:causal]",
                    help="after the rounds, each build's sustained rate, SM clock and power on this shape")
    ap.add_argument("--clocks-reference", choices=("cudnn", "flash", "both"), default="cudnn",
                    help="the SDPA backend run beside each build under --clocks")
    args = ap.parse_args()
    args.tests = args.tests or args.check
    os.makedirs(args.out, exist_ok=True)

    trees = [source_tree(source, args.out) for source in args.sources]  # (name, source folder)
    folders = [os.path.join(args.out, name) for name, _ in trees]
    jobs = max(2, (os.cpu_count() or 2) // len(trees))

    tested = tested_sources(len(trees), args.tests, args.check_first)

    def build_tree(tree, folder, tests):
        os.makedirs(folder, exist_ok=True)
        return build(tree[1], os.path.join(folder, "build"), args.head_dims, tests, jobs,
                     os.path.join(folder, "log.txt"))

    with concurrent.futures.ThreadPoolExecutor(len(trees)) as pool:
        built = list(pool.map(build_tree, trees, folders, tested))

    if args.check:  # the builds side by side (correctness only), all before any benchmark
        checked = [(name, folder) for (name, _), folder, ok, t in zip(trees, folders, built, tested) if ok and t]
        with concurrent.futures.ThreadPoolExecutor(max(1, len(checked))) as pool:
            verdicts = list(pool.map(lambda c: check(c[1], os.path.join(c[1], "check.txt")), checked))
        for (name, folder), verdict in zip(checked, verdicts):
            print(f"{name}: {verdict} (log: {folder}/check.txt)", file=sys.stderr)

    bench_options = ["--head-dims", args.head_dims]
    if args.seqlens:
        bench_options += ["--seqlens", args.seqlens]
    elif not args.full:
        bench_options.append("--quick")
    bench_options += [flag for flag, on in (("--forward-only", args.forward_only), ("--no-sm80", args.no_sm80)) if on]
    bench_options += ["--masks", args.masks]
    runs = {name: [] for (name, _), ok in zip(trees, built) if ok}  # name -> [{(d, n, causal): row}] per round
    for (name, _), ok in zip(trees, built):
        if not ok:
            print(f"{name}: build failed, see {os.path.join(args.out, name, 'log.txt')}", file=sys.stderr)
    for round_ in range(1, args.rounds + 1):
        for (name, _), folder, ok in zip(trees, folders, built):
            if not ok:
                continue
            log, jsonl = os.path.join(folder, "log.txt"), os.path.join(folder, f"bench-{round_}.jsonl")
            bench = [sys.executable, os.path.join(ROOT, "bench", "bench_cuda.py"), "--library",
                     os.path.join(folder, "build", "libflashattn.so"), *bench_options,
                     "--markdown", os.path.join(folder, f"bench-{round_}.md"), "--jsonl", jsonl]
            if not run(bench, log):
                print(f"{name}: benchmark failed in round {round_}, see {log}", file=sys.stderr)
                continue
            runs[name].append({(r["d"], r["n"], r["causal"]): r for r in map(json.loads, open(jsonl))})
            print(f"{name}: measured (round {round_})", file=sys.stderr)
    results = [(name, average_rounds(rounds)) for name, rounds in runs.items() if rounds]

    if not results:
        sys.exit(1)
    print(side_by_side(results))
    for shape in args.clocks:
        label = f"d{shape[0]}-n{shape[1]}" + ("-causal" if shape[2] else "")
        for (name, _), folder, ok in zip(trees, folders, built):
            if not ok:
                continue
            command = clocks_command(shape, os.path.join(folder, "build", "libflashattn.so"), args.clocks_reference)
            result = subprocess.run(command, capture_output=True, text=True)
            table = result.stdout if result.returncode == 0 else result.stdout + result.stderr[-2000:]
            with open(os.path.join(folder, f"clocks-{label}.md"), "w") as f:
                f.write(table)
            print(f"\n{name}, {label}:\n{table}")


if __name__ == "__main__":
    main()

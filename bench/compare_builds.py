"""Benchmarks several builds of flashattn in one run on one GPU, side by side.

    python bench/compare_builds.py OUT SOURCE [SOURCE ...] [--head-dims 64,128] [--full] [--tests | --check]

Each SOURCE is a source tree (a folder with CMakeLists.txt) or a git ref of this repository,
exported with `git archive`. All are built at once into OUT/<name>/build (the head dims measured;
CUDA architectures from FLASHATTN_CUDA_ARCHS, default 90; with --tests the CUDA test binary too,
OUT/<name>/build/tests/cuda/flashattn_cuda_tests; with --check that binary also runs, whole and
under compute-sanitizer memcheck, racecheck and synccheck on a subset, before the benchmarks,
and a line per build says how each check went), then measured one after the other with
bench/bench_cuda.py (--quick unless --full);
the tables land in OUT/<name>/bench.md and a side-by-side table of the forward, backward and
deterministic backward of every build, with cuDNN's from the first build's run, is printed at the
end. Kernel variants are compared within one run of one machine, as the figures of
docs/performance.md are.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--full", action="store_true", help="every N of bench_cuda.py, not --quick")
    ap.add_argument("--tests", action="store_true", help="build each source's CUDA test binary too")
    ap.add_argument("--check", action="store_true",
                    help="build and run each source's CUDA tests, and memcheck, racecheck and synccheck on a subset")
    args = ap.parse_args()
    args.tests = args.tests or args.check
    os.makedirs(args.out, exist_ok=True)

    trees = [source_tree(source, args.out) for source in args.sources]  # (name, source folder)
    folders = [os.path.join(args.out, name) for name, _ in trees]
    jobs = max(2, (os.cpu_count() or 2) // len(trees))

    def build_tree(tree, folder):
        os.makedirs(folder, exist_ok=True)
        return build(tree[1], os.path.join(folder, "build"), args.head_dims, args.tests, jobs,
                     os.path.join(folder, "log.txt"))

    with concurrent.futures.ThreadPoolExecutor(len(trees)) as pool:
        built = list(pool.map(build_tree, trees, folders))

    if args.check:  # one build at a time: the GPU is not shared with a benchmark
        for (name, _), folder, ok in zip(trees, folders, built):
            if ok:
                print(f"{name}: {check(folder, os.path.join(folder, 'check.txt'))} (log: {folder}/check.txt)",
                      file=sys.stderr)

    results = []  # (name, {(d, n, causal): row})
    for (name, _), folder, ok in zip(trees, folders, built):
        log = os.path.join(folder, "log.txt")
        library = os.path.join(folder, "build", "libflashattn.so")
        if not ok:
            print(f"{name}: build failed, see {log}", file=sys.stderr)
            continue
        jsonl = os.path.join(folder, "bench.jsonl")
        bench = [sys.executable, os.path.join(ROOT, "bench", "bench_cuda.py"), "--library", library,
                 "--head-dims", args.head_dims, "--markdown", os.path.join(folder, "bench.md"), "--jsonl", jsonl]
        if not args.full:
            bench.append("--quick")
        if not run(bench, log):
            print(f"{name}: benchmark failed, see {log}", file=sys.stderr)
            continue
        rows = [json.loads(line) for line in open(jsonl)]
        results.append((name, {(r["d"], r["n"], r["causal"]): r for r in rows}))
        print(f"{name}: measured", file=sys.stderr)

    if not results:
        sys.exit(1)
    measured = lambda x: x is not None and x == x  # neither missing nor NaN
    num = lambda x: f"{x:.0f}" if measured(x) else "-"
    # The kernels the library picks (ours), and the mma.sync ones where the machine has sm_90a ones.
    columns = ["ours_fwd", "ours_bwd", "ours_bwd_det"]
    if any(measured(r.get("sm80_fwd")) for _, rows in results for r in rows.values()):
        columns += ["sm80_fwd", "sm80_bwd"]
    head = "| d | N | causal | cuDNN fwd | cuDNN bwd | FLASH fwd | FLASH bwd | " + " | ".join(
        f"{name} {c.replace('ours_', '').replace('_', ' ')}" for name, _ in results for c in columns) + " |"
    print(head)
    print("|" + "---|" * (7 + len(columns) * len(results)))
    for key, first in results[0][1].items():
        d, n, causal = key
        cells = [str(d), str(n), "yes" if causal else "no"] + [
            num(first[c]) for c in ("cudnn_fwd", "cudnn_bwd", "flash_fwd", "flash_bwd")]
        for _, rows in results:
            r = rows.get(key)
            cells += [num(r.get(c)) for c in columns] if r else ["-"] * len(columns)
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Builds flashattn with the CUDA backend, runs every test (GPU tests included, and the forward
# and backward sweeps again on the sm80 kernels), runs compute-sanitizer memcheck, racecheck and synccheck on a
# representative subset, shows that the sm_90a kernels are on the Hopper path (HGMMA and UTMALDG
# in their SASS, no spills in ptxas's report), and benchmarks the CUDA kernels against PyTorch's
# SDPA backends, all in one run on a machine with an NVIDIA GPU.
#
#   scripts/gpu_check.sh OUTPUT_DIR [--quick | --no-bench]
#
# Logs land in OUTPUT_DIR: build.log, cpu_tests.log, cuda_tests.log, cuda_sm80*.log,
# memcheck.log, racecheck.log, synccheck.log, python.log,
# sm90_evidence.txt, bench.md (and bench.jsonl, bench-forward.svg, bench-backward.svg);
# the last lines printed are a summary. --quick benchmarks a subset of the shapes, --no-bench
# none. GoogleTest comes from third_party/googletest when the machine has no package (copy
# /usr/src/googletest there).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUTPUT_DIR [--quick | --no-bench]}
quick=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FLASHATTN_GPU_BUILD:-$root/build-gpu}
mkdir -p "$out"
summary=()
# A kernel that deadlocks hangs its process: every step runs under a time limit (seconds,
# FLASHATTN_STEP_TIMEOUT, default 600) and reports TIMED OUT instead of holding the machine.
limit=${FLASHATTN_STEP_TIMEOUT:-600}
step() {  # step NAME LOG COMMAND...: runs and records pass/fail with the time taken
  local name=$1 log=$2
  shift 2
  local start=$SECONDS rc=0
  timeout "$limit" "$@" >"$out/$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then summary+=("$name: ok ($((SECONDS - start)) s)")
  elif [ "$rc" -eq 124 ]; then summary+=("$name: TIMED OUT after $limit s (a hang? see $log)")
  else summary+=("$name: FAILED ($((SECONDS - start)) s, see $log)"); fi
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
arch=${arch:-90}
step configure configure.log cmake -S "$root" -B "$build" -G Ninja -DFLASHATTN_CUDA=ON \
  -DFLASHATTN_CUDA_ARCHS="$arch" -DFLASHATTN_BUILD_PYTHON=OFF -DFLASHATTN_PTXAS_REPORT=ON
step build build.log cmake --build "$build" -j "$(nproc)"
step cuda_tests cuda_tests.log "$build/tests/cuda/flashattn_cuda_tests"
step cuda_sm80 cuda_sm80.log env FLASHATTN_CUDA_KERNELS=sm80 "$build/tests/cuda/flashattn_cuda_tests" \
  --gtest_brief=1 --gtest_filter='*MatchesOracle*:CudaAttentionRuns.*'
# The sm80 configurations of GPUs with less shared memory (A100, then sm_86/89) on this one.
for smem in 166912 101376; do
  step "cuda_sm80_smem$smem" "cuda_sm80_smem$smem.log" env FLASHATTN_CUDA_KERNELS=sm80 FLASHATTN_CUDA_MAX_SMEM=$smem \
    "$build/tests/cuda/flashattn_cuda_tests" --gtest_brief=1 --gtest_filter='*MatchesOracle*:CudaAttentionRuns.Deterministic*:CudaAttentionRuns.BackwardFits*'
done

# The sm_90a kernels: tensor-core and TMA instructions (loads; the backward's dQ reduce-adds, and
# no atomics) in their SASS, ptxas's spill report.
sm90_objects=$(find "$build/src/cuda" -name 'sm90_*ward_*.o' 2>/dev/null | sort)
if [ -n "$sm90_objects" ] && command -v cuobjdump >/dev/null; then
  for o in $sm90_objects; do
    sass=$(cuobjdump --dump-sass "$o")
    printf '%s: HGMMA %s, UTMALDG %s, UTMAREDG %s, RED/ATOM %s, HMMA %s\n' "$(basename "$o")" \
      "$(grep -c HGMMA <<<"$sass")" "$(grep -c UTMALDG <<<"$sass")" "$(grep -c UTMAREDG <<<"$sass")" \
      "$(grep -cE ' (RED|ATOM)' <<<"$sass")" "$(grep -c ' HMMA' <<<"$sass")"
  done >"$out/sm90_evidence.txt"
  grep -A3 "Compiling entry function '_ZN9flashattn4cuda4sm90" "$out/build.log" | grep -E "spill|Used" | sort | uniq -c \
    >>"$out/sm90_evidence.txt"
fi

if [ "$quick" != "--no-bench" ]; then
  step bench bench.log env PYTHONUNBUFFERED=1 python3 "$root/bench/bench_cuda.py" --library "$build/libflashattn.so" \
    --markdown "$out/bench.md" --jsonl "$out/bench.jsonl" $quick
  step plots plots.log python3 "$root/bench/plot_bench.py" "$out/bench.jsonl" "$out/bench"
fi

# Sanitizers on a subset (scripts/sanitizer_filters.sh).
source "$root/scripts/sanitizer_filters.sh"
if command -v compute-sanitizer >/dev/null; then
  step memcheck memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$build/tests/cuda/flashattn_cuda_tests" --gtest_filter="$SANITIZER_MEMCHECK"
  step racecheck racecheck.log compute-sanitizer --tool racecheck --error-exitcode 1 \
    "$build/tests/cuda/flashattn_cuda_tests" --gtest_filter="$SANITIZER_RACECHECK"
  step synccheck synccheck.log compute-sanitizer --tool synccheck --error-exitcode 1 \
    "$build/tests/cuda/flashattn_cuda_tests" --gtest_filter="$SANITIZER_SYNCCHECK"
else
  summary+=("sanitizers: compute-sanitizer not found")
fi
step cpu_tests cpu_tests.log "$build/tests/flashattn_tests"

# The Python package on this GPU, built with the CUDA backend, and its test suite (offline
# machines: put the build requirements in third_party/wheels first, pip download -d
# third_party/wheels scikit-build-core nanobind).
if python3 -c "import numpy, pytest" 2>/dev/null; then
  step python python.log "$root/scripts/python_suite.sh" "$build/python" ON "$arch"
else
  summary+=("python: numpy or pytest not found, suite skipped")
fi


grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/cuda_tests.log" | head -20
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/memcheck.log" "$out/racecheck.log" "$out/synccheck.log" 2>/dev/null
[ -f "$out/sm90_evidence.txt" ] && cat "$out/sm90_evidence.txt"
[ -f "$out/bench.md" ] && cat "$out/bench.md"
printf '%s\n' "${summary[@]}"

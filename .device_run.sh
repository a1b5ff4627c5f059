#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
log=$OUT/log.txt
s() { local name=$1 t=$2; shift 2; local st=$SECONDS rc=0; timeout $t "$@" >$OUT/$name.log 2>&1 || rc=$?; echo "$name rc=$rc $((SECONDS-st))s" | tee -a $log; }
. scripts/sanitizer_filters.sh
build() {
  for t in "$@"; do
    (cmake -S build-variants/$t -B build-variants/$t/b -G Ninja -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_ARCHS=90 "-DFLASHATTN_HEAD_DIMS=64;128;256" -DFLASHATTN_BUILD_PYTHON=OFF -DFLASHATTN_PTXAS_REPORT=ON >$OUT/cfg_$t.log 2>&1 && cmake --build build-variants/$t/b -j 8 --target flashattn flashattn_cuda_tests >$OUT/build_$t.log 2>&1; echo "build $t rc=$?" >>$log) &
  done
  wait
}
verify() {  # verify TREE [sanitizers]
  local T=build-variants/$1/b/tests/cuda/flashattn_cuda_tests
  s tests_$1 200 $T --gtest_brief=1
  for k in ${SAN-memcheck racecheck synccheck}; do f=SANITIZER_${k^^}; s ${k}_$1 300 compute-sanitizer --tool $k --error-exitcode 1 $T --gtest_brief=1 --gtest_filter="${!f}"; done
  for n in tests memcheck racecheck synccheck; do [ -f $OUT/${n}_$1.log ] && { echo "== $n $1"; grep -E "PASSED|FAILED|ERROR SUMMARY|Failure|hazard" $OUT/${n}_$1.log | head -12; } >>$log; done
}
bench() {  # bench TREE NAME ARGS...
  local t=$1 n=$2; shift 2
  s bench_${t}_$n 250 python3 build-variants/$t/bench/bench_cuda.py --library build-variants/$t/b/libflashattn.so "$@"
}
"$@"
echo done >>$log

#!/usr/bin/env bash
# Builds everything with tests (CUDA too when nvcc is present) and runs every test: the C++ suite
# through CTest (GPU tests skip visibly without a GPU) and the Python suite through pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

cmake --preset test
cmake --build --preset test -j "$jobs"
ctest --preset test -j "$jobs"

# Where the build above included CUDA, the CPU-only build (what a machine without the toolkit gets)
# must still build and run: its CLI, once, on a small problem.
if command -v nvcc >/dev/null 2>&1; then
  cmake --preset cpu >/dev/null
  cmake --build --preset cpu -j "$jobs" --target flashattn_cli
  build/cpu/apps/flashattn run --seqlen 256 --backward >/dev/null
fi

if [ -f pyproject.toml ]; then
  # The Python package builds its own copy of the library; it needs the CUDA backend only where a
  # GPU can run it.
  cuda=OFF
  nvidia-smi >/dev/null 2>&1 && cuda=AUTO
  scripts/python_suite.sh build/test/python "$cuda"
fi

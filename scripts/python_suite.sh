#!/usr/bin/env bash
# Builds the Python package into a folder of its own and runs its test suite, and the tests of the
# benchmark tools (bench/tests):
#
#   scripts/python_suite.sh DIR CUDA [CUDA_ARCHS]
#
# DIR holds the build, the installed package (DIR/site) and, where the build requirements
# (scikit-build-core, nanobind) are not installed, those too (DIR/deps: from third_party/wheels
# when that folder exists, for machines without a network, else from PyPI). CUDA is the
# package's FLASHATTN_CUDA setting (ON, OFF or AUTO). numpy and pytest must be installed.
set -euo pipefail
dir=$(mkdir -p "$1" && cd "$1" && pwd)
cuda=$2
archs=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
pip=(python3 -m pip install -q --disable-pip-version-check)
offline=()
[ -d "$root/third_party/wheels" ] && offline=(--no-index --find-links "$root/third_party/wheels")

export PYTHONPATH=$dir/deps${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import scikit_build_core, nanobind" 2>/dev/null; then
  "${pip[@]}" --target "$dir/deps" "${offline[@]}" scikit-build-core nanobind
fi
rm -rf "$dir/site"
defines=(-C "cmake.define.FLASHATTN_CUDA=$cuda")
[ -n "$archs" ] && defines+=(-C "cmake.define.FLASHATTN_CUDA_ARCHS=$archs")
"${pip[@]}" --no-build-isolation --no-deps --target "$dir/site" "${defines[@]}" -C "build-dir=$dir/build" "$root"
PYTHONPATH=$dir/site python3 -m pytest -q "$root/python/tests" "$root/bench/tests"

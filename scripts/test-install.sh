#!/usr/bin/env bash
# Installs a built tree into a scratch prefix, then builds and runs the examples against it twice:
# through find_package(flashattn) and through pkg-config.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/examples" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake" >/dev/null
"$work/cmake/c_forward"
"$work/cmake/cpp_forward"
libdir=$(dirname "$(find "$work/prefix" -name flashattn.pc)")
export PKG_CONFIG_PATH="$libdir"
cc "$src/examples/c_forward.c" $(pkg-config --cflags --libs flashattn) -lm -Wl,-rpath,"$work/prefix/lib" \
   -Wl,-rpath,"$(pkg-config --variable=libdir flashattn)" -o "$work/c_forward_pc"
"$work/c_forward_pc"
echo "install OK: find_package and pkg-config consumers built and ran"

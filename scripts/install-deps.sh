#!/usr/bin/env bash
# Installs what building and testing flashattn needs: Debian packages (compiler, CMake, Ninja,
# GoogleTest, pkg-config) and the Python packages of scripts/python-requirements.txt.
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake ninja-build pkg-config googletest libgtest-dev python3-venv libopenblas-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ -f scripts/python-requirements.txt ]; then
  python3 -m pip install -q --disable-pip-version-check -r scripts/python-requirements.txt
fi

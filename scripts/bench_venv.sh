#!/usr/bin/env bash
# Makes, once, the venv of PyPI's current torch (MKL, oneDNN, torch.compile) that the
# side-by-side benchmarks compare against, and prints its path: build/bench-venv. The
# first time is a download of several GB, so no test needs it.
#   python=$(scripts/bench_venv.sh)/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/bench-venv
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv" >&2
"$venv/bin/python" -c "import torch, numpy" 2>/dev/null ||
  "$venv/bin/pip" install --quiet --disable-pip-version-check torch numpy >&2
echo "$venv"

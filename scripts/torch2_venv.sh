#!/usr/bin/env bash
# Makes, once per machine, the venv of PyPI's current torch 2.x (with numpy and pytest) on
# Debian's python3, and prints its path. The test command runs the torch.compile / export /
# opcheck tests in it and the side-by-side benchmarks compare against its torch (MKL, oneDNN,
# torch.compile). It lives outside the repository, in ${XDG_CACHE_HOME:-~/.cache}/posembed/
# torch2-venv (POSEMBED_TORCH2_VENV overrides), so fresh clones on one machine share it: the
# first time is a download of about 5 GB (torch pulls its CUDA wheels), about 75 s on a fast
# link; afterwards the script only checks the imports.
#   python=$(scripts/torch2_venv.sh)/bin/python
set -euo pipefail
venv=${POSEMBED_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/posembed/torch2-venv}
ready() {
  "$venv/bin/python" -c "import numpy, pytest, torch
major, minor = (int(x) for x in torch.__version__.split('.')[:2])
assert (major, minor) >= (2, 4), torch.__version__" 2>/dev/null
}
if ! ready; then
  mkdir -p "$(dirname "$venv")"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "torch>=2.4" numpy pytest >&2
  ready || { echo "torch2_venv.sh: $venv has no torch >= 2.4 after pip install" >&2; exit 1; }
fi
echo "$venv"

#!/usr/bin/env bash
# Prints the path of the venv of PyPI's current torch (MKL, oneDNN, torch.compile) that the
# side-by-side benchmarks compare against: the torch 2.x venv of scripts/torch2_venv.sh, which
# the test command also uses, made once per machine outside the repository (a download of
# about 5 GB the first time).
#   python=$(scripts/bench_venv.sh)/bin/python
set -euo pipefail
exec "$(dirname "$0")/torch2_venv.sh"

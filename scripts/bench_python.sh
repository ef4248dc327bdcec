#!/usr/bin/env bash
# bench/python_bench.py under Debian's torch 1.13 (the test venv) and under PyPI's current
# torch in the venv of scripts/torch2_venv.sh (made once per machine, outside the repository;
# the test command uses it too). Arguments go to the bench.
#   scripts/bench_python.sh                 2 threads, 3 rounds
#   scripts/bench_python.sh --threads 1 --json
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
bench=$(scripts/bench_venv.sh)
site=$PWD/build/torch2-site  # this checkout's wheel, beside the shared venv (python_wheel.sh)
scripts/python_wheel.sh build/pyvenv "$bench=$site"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
build/pyvenv/bin/python bench/python_bench.py "$@"
echo
PYTHONPATH=$site "$bench/bin/python" bench/python_bench.py "$@"

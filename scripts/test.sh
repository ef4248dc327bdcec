#!/usr/bin/env bash
# Builds and runs every test: the README's test command, and what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
jobs=$(nproc)
# Idle OpenMP threads sleep instead of spinning, so that tests running side by side
# (ctest -j) do not starve each other.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"
# The Python package: built as `pip wheel .` builds it, tested with pytest.
scripts/test_python.sh
# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer (-O1, no
# benchmarks); it shares the main build's download cache. It is also the build
# without MPI, whose test checks that mpirun gets a clear error from it.
cmake -S . -B build-asan -G Ninja -DPOSEMBED_SANITIZE=ON -DPOSEMBED_BUILD_BENCH=OFF -DPOSEMBED_MPI=OFF \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DPOSEMBED_TEST_CACHE="$PWD/build/test-cache" >/dev/null
cmake --build build-asan -j "$jobs"
# install_consumer is left out: it links an uninstrumented program against the
# instrumented library, which ASan refuses; the main build runs it.
ctest --test-dir build-asan --output-on-failure -j "$jobs" -E '^install_consumer$'
# The safetensors parser under libFuzzer (clang, ASan + UBSan) for a bounded time.
scripts/fuzz.sh 45

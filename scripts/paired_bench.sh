#!/usr/bin/env bash
# A kernel change against the code before it, side by side in one process
# (bench/paired_bench.cpp): builds BASE's library (a commit, tag or branch) from
# `git archive` in build/paired-base and the working tree's in build/paired-new,
# both Release with the same options, then times each kernel of both,
# alternating, every run cold, and checks they write the same bits. Leaves the
# user's build/ as it is.
#   scripts/paired_bench.sh HEAD~1
#   scripts/paired_bench.sh 41c5b4c --kernels backward_sparse --ids zipf --pairs 60
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: scripts/paired_bench.sh BASE [paired_bench flags]" >&2
  exit 2
fi
base=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "paired_bench.sh: $1 is not a commit" >&2; exit 2; }
shift
old=build/paired-base new=build/paired-new
# Another commit: start over. git archive's files carry the commit's time, which
# can be older than the objects of the last base's build, so an incremental
# build of a new base could keep the old library.
if [ "$(cat "$old/COMMIT" 2>/dev/null)" != "$base" ]; then
  rm -rf "$old"
  mkdir -p "$old/src"
  git archive "$base" | tar -x -C "$old/src"
fi
options=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DPOSEMBED_SANITIZE=OFF
         -DPOSEMBED_BUILD_TESTS=OFF -DPOSEMBED_BUILD_CLI=OFF -DPOSEMBED_BUILD_PYTHON=OFF -DPOSEMBED_MPI=OFF)
cmake -S "$old/src" -B "$old/build" "${options[@]}" -DPOSEMBED_BUILD_BENCH=OFF >/dev/null
# The kernels' library: libposembed_core since the library was split by layer,
# libposembed before.
old_lib=posembed
grep -q "posembed_layer(core)" "$old/src/src/posembed/core/CMakeLists.txt" && old_lib=posembed_core
cmake --build "$old/build" -j "$(nproc)" --target "$old_lib"
echo "$base" > "$old/COMMIT"  # only once its library is built
cmake -S . -B "$new" "${options[@]}" -DPOSEMBED_BUILD_BENCH=ON >/dev/null
cmake --build "$new" -j "$(nproc)" --target posembed_core paired_bench
exec "$new/bench/paired_bench" "$old/build/lib$old_lib.so" "$new/libposembed_core.so" "$@"

#!/usr/bin/env bash
# Installs posembed from BUILD_DIR into a scratch prefix, builds the README's
# example against it with find_package(posembed), and runs it.
set -euo pipefail
build_dir=$(cd "$1" && pwd) source_dir=$(cd "$2" && pwd)
work=$(mktemp -d "$build_dir/consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/tests/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DUSAGE_SOURCE="$source_dir/examples/usage.cpp" >/dev/null
cmake --build "$work/build" >/dev/null
out=$("$work/build/usage")
echo "$out"
# The example must run to its end, not merely start.
grep -q "updated [0-9]* token rows" <<<"$out"

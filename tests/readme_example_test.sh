#!/usr/bin/env bash
# The README must not drift from the code: its C++ example is examples/usage.cpp
# verbatim (which the consumer test compiles), and its parameter table is what
# `posembed config --markdown` prints from the config struct.
set -euo pipefail
source_dir=$1 posembed=$2
readme="$source_dir/README.md"
block=$(awk '/<!-- usage.cpp -->/{found=1; next} found && /^```cpp/{inside=1; next} inside && /^```/{exit} inside' "$readme")
if [ -z "$block" ]; then echo "README has no cpp block after <!-- usage.cpp -->"; exit 1; fi
diff <(printf '%s\n' "$block") "$source_dir/examples/usage.cpp"
table=$(awk '/<!-- config -->/{found=1; next} found && /^$/{exit} found' "$readme")
diff <(printf '%s\n' "$table") <("$posembed" config --markdown)
echo "README example and parameter table match the code"

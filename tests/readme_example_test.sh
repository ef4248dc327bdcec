#!/usr/bin/env bash
# The README must not drift from the code: its C++ and Python examples are the
# files in examples/ verbatim (the consumer test compiles the C++ one, pytest runs
# the Python ones), and its parameter table is what
# `posembed config --markdown` prints from the config struct.
set -euo pipefail
source_dir=$1 posembed=$2
readme="$source_dir/README.md"
# A fenced block of LANGUAGE right after the README's <!-- FILE --> marker must be
# examples/FILE verbatim.
check_example() {
  local file=$1 language=$2 block
  block=$(awk -v marker="<!-- $file -->" -v fence="^\`\`\`$language" \
    '$0 == marker {found=1; next} found && $0 ~ fence {inside=1; next} inside && /^```/{exit} inside' "$readme")
  if [ -z "$block" ]; then echo "README has no $language block after <!-- $file -->"; exit 1; fi
  diff <(printf '%s\n' "$block") "$source_dir/examples/$file"
}
check_example usage.cpp cpp
check_example usage.py python
check_example huggingface.py python
table=$(awk '/<!-- config -->/{found=1; next} found && /^$/{exit} found' "$readme")
diff <(printf '%s\n' "$table") <("$posembed" config --markdown)
echo "README example and parameter table match the code"

#!/usr/bin/env bash
# The README's `posembed plan` outputs must be what the code prints: each block
# after a `<!-- plan ARGS -->` marker is diffed against `posembed plan ARGS`.
set -euo pipefail
readme=$1/README.md posembed=$2
markers=$(grep -o '^<!-- plan [^>]* -->$' "$readme" | sed 's/^<!-- plan \(.*\) -->$/\1/')
if [ -z "$markers" ]; then echo "README has no <!-- plan ARGS --> block"; exit 1; fi
while IFS= read -r args; do
  block=$(awk -v m="<!-- plan $args -->" '$0 == m {found=1; next}
    found && /^```/ {if (inside) exit; inside=1; next} inside' "$readme")
  # shellcheck disable=SC2086  # ARGS are words on purpose
  diff <(printf '%s\n' "$block") <("$posembed" plan $args) || { echo "README block 'plan $args' is stale"; exit 1; }
  echo "plan $args: README matches"
done <<< "$markers"

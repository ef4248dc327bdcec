#!/usr/bin/env bash
# The README's "What we measured" verdicts must be the committed report's
# (docs/experiments/REPORT.md, written by `posembed experiment all`), and every
# plot the report or the README shows must exist.
set -euo pipefail
src=$1
readme="$src/README.md" report="$src/docs/experiments/REPORT.md"
ours=$(awk '/^## What we measured/{f=1; next} f && /^## /{exit} f' "$readme" |
  sed -n 's/^| \([1-7]\) | [^|]* | \([a-z ]*\) | .*/\1 \2/p')
theirs=$(sed -n 's/^| \([1-7]\) | \[[^|]*\]([^)]*) | \*\*\([a-z ]*\)\*\* | .*/\1 \2/p' "$report")
if [ "$(printf '%s\n' "$ours" | wc -l)" -ne 7 ]; then echo "README table: expected 7 verdicts, got: $ours"; exit 1; fi
diff <(printf '%s\n' "$ours") <(printf '%s\n' "$theirs") || { echo "README verdicts differ from $report"; exit 1; }
for img in $(grep -o '(docs/experiments/[^)]*\.png)' "$readme" | tr -d '()'); do
  [ -f "$src/$img" ] || { echo "README shows missing $img"; exit 1; }
done
for img in $(grep -o '([a-z_0-9]*\.png)' "$report" | tr -d '()'); do
  [ -f "$src/docs/experiments/$img" ] || { echo "report shows missing $img"; exit 1; }
done
echo "README verdicts match the report; all plots present"

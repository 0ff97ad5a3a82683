#!/usr/bin/env bash
# Fails, naming the files, when the kernel side's C (bpf/, bench/bpf/) is not
# formatted as .clang-format says; `scripts/check-format.sh --fix` rewrites
# them. The style is clang-format 14's (Debian 12): another major version may
# format some lines differently, so it is checked with that one.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
want=14
have=$( (clang-format --version 2>/dev/null || true) | sed -n 's/.*clang-format version \([0-9][0-9]*\)\..*/\1/p' | head -n 1)
if [ "$have" != "$want" ]; then
  echo "check-format: clang-format ${have:-missing}, the style is checked with clang-format $want (Debian 12's clang-format package): not checked" >&2
  [ "${CI:-}" = true ] && exit 1
  exit 0
fi
mapfile -t files < <(git ls-files ':(glob)bpf/*.[ch]' ':(glob)bench/bpf/*.[ch]') # not bpf/include: vendored
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format "$f" | cmp -s "$f" - || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: not formatted as .clang-format says: ${bad[*]}; run scripts/check-format.sh --fix, then make generate" >&2
  exit 1
fi

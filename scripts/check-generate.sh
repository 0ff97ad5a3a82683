#!/usr/bin/env bash
# Fails when the committed bpf2go outputs (internal/**, bench/**: *_bpfel.{go,o}) do
# not match what their C sources generate: regenerates in a scratch copy of
# the tree and compares byte for byte.
#
# The objects depend on the compiler: they are made by the Debian clang whose
# major version is in scripts/clang-version. With another clang the comparison
# means nothing, so it is not made: one line says so and what to do (under
# CI=true that fails; elsewhere it is a skip). `--clang` does that check alone
# (make generate).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
want=$(tr -d '[:space:]' < "$top/scripts/clang-version")
have=$(clang --version 2>/dev/null | sed -n 's/.*clang version \([0-9][0-9]*\)\..*/\1/p' | head -n 1)
if [ "$have" != "$want" ]; then
  echo "check-generate: this machine's clang is ${have:-missing}, the committed BPF objects come from Debian clang $want (scripts/clang-version): not compared; use a machine with clang $want (Debian 12), or regenerate with 'make generate' and commit the objects with the new version in scripts/clang-version" >&2
  [ "${CI:-}" = true ] && exit 1
  exit 0
fi
[ "${1:-}" = --clang ] && exit 0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$top"
git ls-files -z | xargs -0 -I{} cp --parents {} "$scratch"/ 2>/dev/null || tar -cf - --exclude=.git . | tar -xf - -C "$scratch"
(cd "$scratch" && go generate ./internal/... ./bench/...)
status=0
while IFS= read -r f; do
  if ! cmp -s "$top/$f" "$scratch/$f"; then
    echo "check-generate: $f differs from what its sources generate; run 'make generate' and commit" >&2
    status=1
  fi
done < <(cd "$scratch" && find internal bench -name '*_bpfel.go' -o -name '*_bpfel.o')
[ $status = 0 ] && echo "check-generate: BPF objects match their sources (clang $have)"
exit $status

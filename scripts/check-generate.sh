#!/usr/bin/env bash
# Fails when the committed bpf2go outputs (internal/**, bench/**: *_bpfel.{go,o}) do
# not match what their C sources generate: regenerates in a scratch copy of
# the tree and compares byte for byte.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
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
[ $status = 0 ] && echo "check-generate: BPF objects match their sources"
exit $status

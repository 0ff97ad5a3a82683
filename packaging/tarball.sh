#!/usr/bin/env bash
# Makes dist/deptrace_VERSION_linux_ARCH.tar.gz with exactly the files of
# the .deb nfpm built (same paths under one top directory), so both
# packages always agree. Usage: tarball.sh DIST VERSION ARCH
set -euo pipefail
dist=$1 version=$2 arch=$3
deb=$(ls "$dist"/deptrace_*_"$arch".deb)
name=deptrace_${version}_linux_${arch}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/$name"
dpkg-deb --extract "$deb" "$stage/$name"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$(git log -1 --format=%ct 2>/dev/null || date +%s)" \
  -C "$stage" -czf "$dist/$name.tar.gz" "$name"
echo "tarball: $dist/$name.tar.gz"

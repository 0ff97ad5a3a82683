#!/usr/bin/env bash
# Regenerates the vendored kernel headers in bpf/include. vmlinux.h comes
# from the running kernel's BTF; CO-RE relocations make the objects built
# against it load on other kernels. The libbpf headers come from Debian's
# libbpf-dev (1.1 when vendored).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bpftool btf dump file /sys/kernel/btf/vmlinux format c > "$top/bpf/include/vmlinux.h"
for h in bpf_helpers.h bpf_helper_defs.h bpf_core_read.h bpf_tracing.h bpf_endian.h; do
  cp /usr/include/bpf/$h "$top/bpf/include/bpf/$h"
done

#!/usr/bin/env bash
# Installs what building, regenerating and testing deptrace need on a fresh
# Debian machine: clang/llvm and libbpf headers (BPF objects), iproute2
# (test namespaces), PostgreSQL server binaries (store tests). Go modules are fetched by the go command itself.
set -euo pipefail
need=()
command -v clang >/dev/null || need+=(clang)
command -v clang-format >/dev/null || need+=(clang-format)  # scripts/check-format.sh (make vet)
command -v llvm-strip >/dev/null || need+=(llvm)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
command -v ip >/dev/null || need+=(iproute2)
command -v bpftool >/dev/null || need+=(bpftool)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)  # store tests start throwaway clusters
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps: missing ${need[*]}; run as root or: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
  echo "deps: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- web (deptrace serve): the browser tests of internal/web drive Debian's
# chromium-headless-shell through chromedp; they fail under CI=true without it.
if ! command -v chromium-headless-shell >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps: missing chromium-headless-shell; run as root or: sudo apt-get install --no-install-recommends chromium-headless-shell" >&2
    exit 1
  fi
  echo "deps: installing chromium-headless-shell" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium-headless-shell >/dev/null
fi

# --- real software (tests/realsoftware): the privileged tests drive Debian's
# nginx, gunicorn, curl and nftables (psql comes with postgresql above; ss and
# nstat with iproute2), and tests/servicemap also redis and memcached; they
# fail under CI=true without them. The tests start their own servers; a
# packaged service that this install starts (where services start on install)
# is stopped and disabled again.
real_need=()
command -v nginx >/dev/null || real_need+=(nginx)
command -v gunicorn >/dev/null || real_need+=(gunicorn)
command -v curl >/dev/null || real_need+=(curl)
command -v nft >/dev/null || real_need+=(nftables)
command -v psql >/dev/null || real_need+=(postgresql-client)
command -v dnsmasq >/dev/null || [ -x /usr/sbin/dnsmasq ] || real_need+=(dnsmasq-base)  # DNS watcher tests (internal/dnswatch, cmd/deptrace)
command -v dig >/dev/null || real_need+=(bind9-dnsutils)
command -v redis-server >/dev/null || real_need+=(redis-server)  # the service-map stack (tests/servicemap)
command -v memcached >/dev/null || real_need+=(memcached)
command -v promtool >/dev/null || real_need+=(prometheus)  # promtool checks packaging/prometheus's rules
if [ ${#real_need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps: missing ${real_need[*]}; run as root or: sudo apt-get install ${real_need[*]}" >&2
    exit 1
  fi
  echo "deps: installing ${real_need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${real_need[@]}" >/dev/null
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    for unit in nginx redis-server memcached prometheus prometheus-node-exporter; do
      systemctl disable --now "$unit" >/dev/null 2>&1 || true
    done
  fi
fi

# --- identity (internal/identity): the privileged Docker test starts its own
# dockerd (Debian's docker.io, data and socket in a temp dir, no iptables
# changes), the CRI test its own containerd, and both build their images from
# busybox-static; they fail under CI=true without them. A docker service that this install starts (where services
# start on install) is stopped and disabled again: a running dockerd sets the
# FORWARD policy to DROP, which breaks the suite's bridged namespaces.
id_need=()
command -v dockerd >/dev/null || [ -x /usr/sbin/dockerd ] || id_need+=(docker.io)
command -v containerd >/dev/null || id_need+=(containerd)  # the CRI test runs its own, with the CRI plugin
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || id_need+=(runc)
command -v podman >/dev/null || id_need+=(podman)  # the podman test runs its own `podman system service`
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || id_need+=(busybox-static)
if [ ${#id_need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps: missing ${id_need[*]}; run as root or: sudo apt-get install ${id_need[*]}" >&2
    exit 1
  fi
  echo "deps: installing ${id_need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${id_need[@]}" >/dev/null
  if [[ " ${id_need[*]} " == *" docker.io "* ]] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now docker.service docker.socket containerd.service >/dev/null 2>&1 || true
  fi
fi

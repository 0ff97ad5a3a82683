# shellcheck shell=bash
# Shared functions of the kernel matrix: fetch Debian kernel packages through a
# private apt configuration, build a small initramfs around static test
# binaries, boot it in qemu (KVM when it is usable, else TCG) and collect what
# the guest printed.
# Sourced by scripts/kernel-matrix/matrix, run and arm64.

KM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KM_ROOT=$(cd "$KM_DIR/../.." && pwd)
KM_CACHE=${KMATRIX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deptrace-kernels}
KM_FLAVOUR=${KMATRIX_FLAVOUR:-cloud-amd64}
KM_MEM=${KMATRIX_MEM:-2G}
KM_SMP=${KMATRIX_SMP:-2}
KM_TIMEOUT=${KMATRIX_TIMEOUT:-5400}          # seconds per guest, boot to power-off
# Loaded in the guest (with their dependencies): veth and bridge for the
# test networks, nftables' NAT for the tracer's DNS forwarder tests (nft).
KM_MODULES=${KMATRIX_MODULES:-veth bridge nf_tables nft_chain_nat nft_nat nft_redir}
KM_PKGS=${KMATRIX_PKGS-./tracer ./internal/bundler ./bench/internal/measure}   # test binaries built for the guest (set but empty: none)
KM_TOOLS=${KMATRIX_HOST_TOOLS:-ip nft}      # host binaries copied in with their libraries
KM_BUSYBOX=${KMATRIX_BUSYBOX:-/bin/busybox} # the guest's static busybox (the arm64 matrix: an arm64 one)
KM_APT="$KM_CACHE/apt"
export PATH="$PATH:/usr/sbin:/sbin"

km_log() { echo "kmatrix: $*" >&2; }
km_die() { echo "kmatrix: $*" >&2; exit 2; }

# km_qemu_major [BINARY] prints the major version of BINARY on PATH
# (default qemu-system-x86_64; 0: none).
km_qemu_major() {
  local v= q=${1:-qemu-system-x86_64}
  command -v "$q" >/dev/null && v=$("$q" --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p;q')
  echo "${v:-0}"
}

# km_qemu_backports [PACKAGE] installs PACKAGE (default qemu-system-x86; the
# arm64 matrix asks for qemu-system-arm) from bookworm-backports (QEMU 10)
# through a private apt configuration under $KM_CACHE/host-apt: its own
# sources list (bookworm, -updates, -security, -backports) and package lists;
# the machine's /etc/apt is neither read for sources nor changed.
km_qemu_backports() {
  local pkg=${1:-qemu-system-x86}
  local a="$KM_CACHE/host-apt" kr=/usr/share/keyrings/debian-archive-keyring.gpg m=http://deb.debian.org
  [ -f "$kr" ] || { km_log "$kr missing (install debian-archive-keyring)"; return 1; }
  mkdir -p "$a/lists/partial" "$a/cache/archives/partial"
  {
    echo "deb [signed-by=$kr] $m/debian bookworm main"
    echo "deb [signed-by=$kr] $m/debian bookworm-updates main"
    echo "deb [signed-by=$kr] $m/debian-security bookworm-security main"
    echo "deb [signed-by=$kr] $m/debian bookworm-backports main"
  } >"$a/sources.list"
  local o=(-o "Dir::Etc::SourceList=$a/sources.list" -o Dir::Etc::SourceParts=/dev/null
           -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o "Dir::Cache::Archives=$a/cache/archives"
           -o APT::Sandbox::User=root -o Acquire::Retries=3)
  km_log "installing $pkg from bookworm-backports (private apt configuration in $a)"
  apt-get "${o[@]}" -qq update >"$a/apt.log" 2>&1 &&
    DEBIAN_FRONTEND=noninteractive apt-get "${o[@]}" install -y -qq --no-install-recommends \
      -t bookworm-backports "$pkg" >>"$a/apt.log" 2>&1 ||
    { tail -n 5 "$a/apt.log" >&2; return 1; }
  rm -f "$a"/cache/archives/*.deb
}

# km_host_deps installs what the matrix needs on the host (Debian): QEMU 8 or
# newer (from bookworm-backports on Debian 12, whose own QEMU is 7.2), static
# busybox, cpio, zstd, xz, file, ip, depmod. It prints the QEMU it will use.
km_host_deps() {
  local need=() codename
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  if [ "$(km_qemu_major)" -lt 8 ] && [ "$(id -u)" = 0 ] && [ "$codename" = bookworm ]; then
    km_qemu_backports || km_log "could not install QEMU from bookworm-backports"
  fi
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  { [ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -x insmod >/dev/null && file -L /bin/busybox 2>/dev/null | grep static >/dev/null; } || need+=(busybox-static)
  command -v cpio >/dev/null || need+=(cpio)
  command -v zstd >/dev/null || need+=(zstd)
  command -v xz >/dev/null || need+=(xz-utils)
  command -v file >/dev/null || need+=(file)
  command -v ip >/dev/null || need+=(iproute2)
  command -v nft >/dev/null || need+=(nftables)
  command -v depmod >/dev/null || [ -x /usr/sbin/depmod ] || [ -x /sbin/depmod ] || need+=(kmod)
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || km_die "missing ${need[*]}; run as root or: sudo apt-get install ${need[*]}"
    km_log "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # file(1) is needed by the check above; re-check busybox now.
    file -L /bin/busybox | grep static >/dev/null || km_die "/bin/busybox is not the static build (install busybox-static)"
  fi
  km_log "using $(command -v qemu-system-x86_64): $(qemu-system-x86_64 --version | head -1)"
  if [ "$(km_qemu_major)" -lt 8 ] && [ -z "${KMATRIX_CPU:-}" ]; then
    km_log "WARNING: QEMU older than 8: the guests run without cx16 (-cpu max,-cx16) to avoid a TCG double fault with 6.12+ guests;" \
           "7.x kernels then fail every BPF socket-storage creation (kmalloc_nolock needs cmpxchg16b), so socket-storage-dependent tests are expected to fail on 7.x"
  fi
}

# km_cpu prints the guest CPU model: under KVM host; under TCG max, or max
# without cx16 on QEMU older than 8 (its TCG double-faults 6.12+ guests at
# cmpxchg16b); for arm64 (KM_ARCH=arm64, TCG only) max with the cheaper
# pointer authentication, several times faster under TCG. KMATRIX_CPU
# overrides.
km_cpu() {
  local cpu=max
  [ "${KM_ARCH:-amd64}" = arm64 ] && { echo "${KMATRIX_CPU:-max,pauth-impdef=on}"; return 0; }
  [ "$(km_qemu_major)" -lt 8 ] && cpu=max,-cx16
  [ "${KM_ACCEL:-tcg}" = kvm ] && cpu=host
  echo "${KMATRIX_CPU:-$cpu}"
}

# km_choose_accel ABI sets KM_ACCEL (kvm or tcg) and KM_ACCEL_WHY, and logs
# them. KMATRIX_ACCEL: tcg or kvm (forced, no probe) or auto (the default):
# KVM when /dev/kvm is usable, the host CPU has hardware virtualization
# (vmx/svm) and a probe boot of ABI under KVM reaches its init; otherwise TCG,
# with the reason logged. (A /dev/kvm without vmx/svm, such as a PVM-style
# KVM inside a container VM, could not boot Debian's stock kernels here.)
km_choose_accel() {
  local abi=$1 req=${KMATRIX_ACCEL:-auto}
  [ -n "${KM_ACCEL:-}" ] && return 0
  case "$req" in
    tcg) KM_ACCEL=tcg KM_ACCEL_WHY="KMATRIX_ACCEL=tcg" ;;
    kvm) KM_ACCEL=kvm KM_ACCEL_WHY="KMATRIX_ACCEL=kvm (not probed)" ;;
    auto)
      KM_ACCEL=tcg
      if ! [ -r /dev/kvm ] || ! [ -w /dev/kvm ]; then
        KM_ACCEL_WHY="no usable /dev/kvm"
      elif ! grep -qw -e vmx -e svm /proc/cpuinfo; then
        KM_ACCEL_WHY="/dev/kvm exists but the host CPU shows no vmx/svm (no hardware virtualization; its KVM could not boot stock kernels)"
      elif km_probe_kvm "$abi"; then
        KM_ACCEL=kvm KM_ACCEL_WHY="probe boot of $abi under KVM passed"
      fi ;;
    *) km_die "KMATRIX_ACCEL=$req (allowed: auto, kvm, tcg)" ;;
  esac
  export KM_ACCEL KM_ACCEL_WHY
  km_log "accelerator $KM_ACCEL, guest CPU $(km_cpu): $KM_ACCEL_WHY"
}

# km_probe_kvm ABI boots ABI under KVM with a busybox-only initramfs that
# prints a marker and powers off (60 s limit). On failure it sets
# KM_ACCEL_WHY to what went wrong and returns 1.
km_probe_kvm() {
  local abi=$1 p r out rc=0
  p=$(mktemp -d "$KM_CACHE/probe.XXXXXX")
  r=$p/root
  mkdir -p "$r"/{bin,proc,sys,dev}
  cp /bin/busybox "$r/bin/busybox"
  printf '#!/bin/busybox sh\n/bin/busybox --install -s /bin\nmount -t proc proc /proc\necho "@@KM PROBE $(uname -r) $(grep -c ^processor /proc/cpuinfo)"\npoweroff -f\n' >"$r/init"
  chmod +x "$r/init"
  (cd "$r" && find . | cpio -o -H newc --quiet | gzip -1) >"$p/initrd.gz"
  out=$(KM_ACCEL=kvm timeout -k 5 60 qemu-system-x86_64 -accel kvm -cpu "$(KM_ACCEL=kvm km_cpu)" -m 512M -smp "$KM_SMP" \
        -no-reboot -nodefaults -display none -kernel "$KM_CACHE/kernels/$abi/vmlinuz" -initrd "$p/initrd.gz" \
        -append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init" -serial stdio </dev/null 2>&1) || rc=$?
  rm -rf "$p"
  if printf '%s\n' "$out" | grep -q "^@@KM PROBE $abi"; then return 0; fi
  KM_ACCEL_WHY="a probe boot of $abi under KVM (-cpu $(KM_ACCEL=kvm km_cpu)) did not reach init (status $rc): $(printf '%s\n' "$out" | tr -d '\r' | grep -v -e '^extra data' -e '^ *$' | grep -m1 -i -e error -e failure -e panic -e 'terminating' || echo 'no console output')"
  return 1
}

# Private apt configuration: Debian's archive serves more suites than this
# machine's sources name. The machine's own apt configuration is untouched.
km_apt_opts() {
  echo "-o Dir::Etc::SourceList=$KM_APT/sources.list -o Dir::Etc::SourceParts=/dev/null" \
       "-o Dir::State::Lists=$KM_APT/lists -o Dir::Cache=$KM_APT/cache -o Dir::Cache::Archives=$KM_APT/cache/archives" \
       "-o Dir::State::status=/dev/null -o APT::Sandbox::User=root -o Debug::NoLocking=1 -o Acquire::Retries=3"
}

km_apt_update() {
  mkdir -p "$KM_APT/lists/partial" "$KM_APT/cache/archives/partial"
  local kr=/usr/share/keyrings/debian-archive-keyring.gpg m=http://deb.debian.org
  [ -f "$kr" ] || km_die "$kr missing (install debian-archive-keyring)"
  {
    echo "deb [signed-by=$kr] $m/debian bullseye main"
    echo "deb [signed-by=$kr] $m/debian-security bullseye-security main"
    echo "deb [signed-by=$kr] $m/debian bookworm main"
    echo "deb [signed-by=$kr] $m/debian-security bookworm-security main"
    echo "deb [signed-by=$kr] $m/debian bookworm-backports main"
    echo "deb [signed-by=$kr] $m/debian trixie main"
    echo "deb [signed-by=$kr] $m/debian-security trixie-security main"
    echo "deb [signed-by=$kr] $m/debian trixie-backports main"
    echo "deb [signed-by=$kr] $m/debian sid main"
  } >"$KM_APT/sources.list"
  # Refresh at most every 6 hours (or never with KMATRIX_OFFLINE=1).
  if [ -n "${KMATRIX_OFFLINE:-}" ]; then return 0; fi
  # Lists read from another sources list (stamp: the one of the last update) are refreshed now.
  if cmp -s "$KM_APT/sources.list" "$KM_APT/lists/sources.stamp" &&
     [ -n "$(find "$KM_APT/lists" -maxdepth 1 -name '*_Packages*' -mmin -360 2>/dev/null | head -1)" ]; then return 0; fi
  km_log "updating the private package lists in $KM_APT"
  # shellcheck disable=SC2046
  if apt-get $(km_apt_opts) -qq update >/dev/null 2>"$KM_APT/update.err"; then
    cp "$KM_APT/sources.list" "$KM_APT/lists/sources.stamp"
  else
    cat "$KM_APT/update.err" >&2; km_log "apt update failed: using the kernels already cached"
  fi
}

# km_resolve SERIES prints the newest kernel ABI name of a series (5.10, 6.1,
# 6.12, 7 = newest 7.x, ...) in the archive, e.g. 6.1.0-56-cloud-amd64.
# With KMATRIX_OFFLINE=1 (or no lists) it falls back to the newest cached one.
km_resolve() {
  local series=$1 re abi
  re="^linux-image-${series//./\\.}[.+-][^ ]*-${KM_FLAVOUR}\$"
  # shellcheck disable=SC2046
  abi=$(apt-cache $(km_apt_opts) pkgnames linux-image- 2>/dev/null | grep -E "$re" | grep -v -e dbg -e unsigned |
        sed 's/^linux-image-//' | sort -V | tail -1 || true)
  if [ -z "$abi" ]; then
    abi=$(ls "$KM_CACHE/kernels" 2>/dev/null | grep -E "${re#^linux-image-}" | sort -V | tail -1 || true)
  fi
  [ -n "$abi" ] || km_die "no $KM_FLAVOUR kernel of series $series in the archive or the cache (allowed: a series such as 5.10, 6.1, 6.12, 7)"
  echo "$abi"
}

# km_fetch ABI downloads and unpacks a kernel into $KM_CACHE/kernels/ABI
# (vmlinuz, config, modules/ with modules.dep); a no-op when it is there.
km_fetch() {
  local abi=$1 d="$KM_CACHE/kernels/$1" p tmp
  [ -f "$d/.complete" ] && return 0
  km_log "fetching linux-image-$abi"
  mkdir -p "$KM_CACHE/kernels"
  tmp=$(mktemp -d "$KM_CACHE/fetch.XXXXXX")
  # Packages of 7.x split the image into linux-binary-* (vmlinuz),
  # linux-modules-* and linux-base-* (config, modules.builtin).
  local pkgs=("linux-image-$abi")
  for p in "linux-binary-$abi" "linux-modules-$abi" "linux-base-$abi"; do
    # shellcheck disable=SC2046
    apt-cache $(km_apt_opts) show "$p" >/dev/null 2>&1 && pkgs+=("$p")
  done
  # shellcheck disable=SC2046
  (cd "$tmp" && apt-get $(km_apt_opts) -qq download "${pkgs[@]}") >&2 || { rm -rf "$tmp"; km_die "download of ${pkgs[*]} failed"; }
  rm -rf "$d"; mkdir -p "$d/x"
  for p in "$tmp"/*.deb; do dpkg-deb -x "$p" "$d/x"; done
  rm -rf "$tmp"
  local mdir=
  for p in "$d/x/lib/modules/$abi" "$d/x/usr/lib/modules/$abi"; do [ -d "$p" ] && mdir=$p && break; done
  [ -n "$mdir" ] || km_die "no modules directory in the packages of $abi"
  mv "$mdir" "$d/modules"
  for p in "$d/x/boot/vmlinuz-$abi" "$d/modules/vmlinuz"; do [ -f "$p" ] && mv "$p" "$d/vmlinuz"; done
  for p in "$d/x/boot/config-$abi" "$d/modules/config"; do [ -f "$p" ] && mv "$p" "$d/config"; done
  [ -f "$d/vmlinuz" ] || km_die "no vmlinuz in the packages of $abi"
  rm -rf "$d/x"
  # The packages ship no modules.dep (their postinst runs depmod).
  mkdir -p "$d/depmod/lib/modules"
  ln -s ../../../modules "$d/depmod/lib/modules/$abi"
  depmod -b "$d/depmod" "$abi" || km_die "depmod for $abi failed"
  touch "$d/.complete"
}

# km_prune removes cached kernels other than the ABIs given.
km_prune() {
  local keep=" $* " k
  for k in "$KM_CACHE"/kernels/*; do
    [ -d "$k" ] || continue
    case "$keep" in *" $(basename "$k") "*) ;; *) km_log "removing old cached kernel $(basename "$k")"; rm -rf "$k" ;; esac
  done
}

# km_build_bins DIR builds deptrace and the test binaries statically into DIR.
km_build_bins() {
  local out=$1 p name
  mkdir -p "$out"
  km_log "building static binaries ($KM_PKGS)"
  (cd "$KM_ROOT" && CGO_ENABLED=0 ${GO:-go} build -o "$out/deptrace" ./cmd/deptrace) || km_die "go build failed"
  for p in $KM_PKGS; do
    name=$(echo "${p#./}" | tr / _).test
    (cd "$KM_ROOT" && CGO_ENABLED=0 ${GO:-go} test -c -o "$out/$name" "$p") || km_die "go test -c $p failed"
    [ -f "$out/$name" ] || km_log "$p has no tests: skipped"
  done
}

# km_modules ABI prints, for the modules in $KM_MODULES, the module files to
# load in dependency order (paths relative to the modules directory).
km_modules() {
  local m="$KM_CACHE/kernels/$1/modules" mod
  declare -A seen=()
  _km_mod() {
    local name=$1 file deps d
    file=$(awk -F: -v n="$name" '{f=$1; sub(/.*\//,"",f); sub(/\.ko(\.[a-z]+)?$/,"",f); gsub(/-/,"_",f); if (f==n) {print $1; exit}}' "$m/modules.dep")
    if [ -z "$file" ]; then
      grep -Eq "/${name//_/[-_]}\.ko\$" "$m/modules.builtin" 2>/dev/null && return 0
      km_die "kernel $1 has no module $name"
    fi
    [ -n "${seen[$file]:-}" ] && return 0
    seen[$file]=1
    deps=$(grep -E "^${file//./\\.}:" "$m/modules.dep" | cut -d: -f2)
    for d in $deps; do
      d=${d##*/}; d=${d%%.ko*}; _km_mod "${d//-/_}"
    done
    echo "$file"
  }
  for mod in $KM_MODULES; do _km_mod "${mod//-/_}"; done
}

# km_initramfs ABI BINDIR GUESTSCRIPT OUT builds a gzip'ed cpio with busybox,
# the host tools of $KMATRIX_HOST_TOOLS (default ip nft) with their libraries,
# the kernel modules, the binaries of
# BINDIR (in /opt/km, on PATH) and GUESTSCRIPT, which /init runs.
km_initramfs() {
  local abi=$1 bins=$2 script=$3 out=$4 r f lib
  r=$(mktemp -d "$KM_CACHE/root.XXXXXX")
  mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,run,tmp,root,etc,opt/km,lib/modules,var}
  cp "$KM_BUSYBOX" "$r/bin/busybox"
  local tool path
  for tool in $KM_TOOLS; do
    path=$(command -v "$tool") || km_die "host tool $tool not found (KMATRIX_HOST_TOOLS)"
    cp -L "$path" "$r/usr/sbin/$tool"
    for lib in $(ldd "$path" 2>/dev/null | grep -o '/[^ ]*'); do
      mkdir -p "$r$(dirname "$lib")"; cp -L "$lib" "$r$lib"
    done
  done
  : >"$r/etc/modules.order"
  for f in $(km_modules "$abi"); do
    mkdir -p "$r/lib/modules/$(dirname "$f")"
    case "$f" in
      *.xz) xz -dc "$KM_CACHE/kernels/$abi/modules/$f" >"$r/lib/modules/${f%.xz}"; f=${f%.xz} ;;
      *.zst) zstd -qdc "$KM_CACHE/kernels/$abi/modules/$f" >"$r/lib/modules/${f%.zst}"; f=${f%.zst} ;;
      *) cp "$KM_CACHE/kernels/$abi/modules/$f" "$r/lib/modules/$f" ;;
    esac
    echo "$f" >>"$r/etc/modules.order"
  done
  cp "$bins"/* "$r/opt/km/"
  cp "$script" "$r/guest.sh"
  cp "$KM_DIR/init" "$r/init"
  chmod +x "$r/init" "$r/guest.sh"
  echo "root:x:0:0:root:/root:/bin/sh" >"$r/etc/passwd"
  echo "root:x:0:" >"$r/etc/group"
  (cd "$r" && find . | cpio -o -H newc --quiet | gzip -1) >"$out"
  rm -rf "$r"
}

# km_boot ABI INITRD OUTDIR [interactive]: boots the guest under a time
# limit. The guest's results go to OUTDIR/results.log (second serial port),
# the kernel console to OUTDIR/console.log. Returns qemu's (or timeout's) status.
# With KM_ARCH=arm64: qemu-system-aarch64 -machine virt under TCG, whose one
# serial port (ttyAMA0) carries both (kmatrix.out=); results.log is then a
# copy of console.log (batch mode only).
km_boot() {
  local abi=$1 initrd=$2 dir=$3 mode=${4:-batch} cpu
  local kdir="$KM_CACHE/kernels/$abi"
  cpu=$(km_cpu)
  if [ "${KM_ARCH:-amd64}" = arm64 ]; then
    local rc=0
    : >"$dir/console.log"
    timeout -k 10 "$KM_TIMEOUT" qemu-system-aarch64 -machine virt -accel tcg -cpu "$cpu" -m "$KM_MEM" -smp "$KM_SMP" \
      -no-reboot -nodefaults -display none -kernel "$kdir/vmlinuz" -initrd "$initrd" \
      -append "console=ttyAMA0 panic=-1 oops=panic loglevel=4 rdinit=/init kmatrix.mode=batch kmatrix.out=/dev/ttyAMA0" \
      -serial "file:$dir/console.log" </dev/null || rc=$?
    cp "$dir/console.log" "$dir/results.log"
    return $rc
  fi
  local append="console=ttyS0 panic=-1 oops=panic loglevel=4 rdinit=/init kmatrix.mode=$mode"
  : >"$dir/results.log"; : >"$dir/console.log"
  local args=(-accel "${KM_ACCEL:-tcg}" -cpu "$cpu" -m "$KM_MEM" -smp "$KM_SMP" -no-reboot -nodefaults -display none
              -kernel "$kdir/vmlinuz" -initrd "$initrd" -append "$append")
  if [ "$mode" = shell ]; then
    timeout --foreground -k 10 "$KM_TIMEOUT" qemu-system-x86_64 "${args[@]}" -serial mon:stdio -serial "file:$dir/results.log"
  else
    timeout -k 10 "$KM_TIMEOUT" qemu-system-x86_64 "${args[@]}" -serial "file:$dir/console.log" -serial "file:$dir/results.log" </dev/null
  fi
}

# km_jobs_max prints how many guests boot at once: KMATRIX_JOBS (default
# one per host CPU: under TCG a guest keeps about one host CPU busy), after
# checking it is a positive integer.
km_jobs_max() {
  local j=${KMATRIX_JOBS:-$(nproc)}
  case "$j" in ''|*[!0-9]*) km_die "KMATRIX_JOBS=$j (allowed: 1 or more guests at once)" ;; esac
  j=$((10#$j))
  [ "$j" -ge 1 ] || km_die "KMATRIX_JOBS=$KMATRIX_JOBS (allowed: 1 or more guests at once)"
  echo "$j"
}

# km_run_guests MAX FUNC ITEM... runs FUNC ITEM in the background for
# every ITEM, the last first (the kernels file and the arm64 series list
# the newest kernel, the slowest under TCG, last), at most MAX at once, and
# waits for them all. Interrupted, it stops them (timeout passes the
# signal on to qemu).
km_run_guests() {
  local max=$1 fn=$2 i
  shift 2
  local items=("$@")
  trap 'for p in $(jobs -p); do pkill -TERM -P "$p" 2>/dev/null; done; exit 130' INT TERM
  for (( i = ${#items[@]} - 1; i >= 0; i-- )); do
    while [ "$(jobs -rp | wc -l)" -ge "$max" ]; do wait -n || true; done
    "$fn" "${items[$i]}" &
  done
  wait
}

# km_tier_read reads scripts/kernel-matrix/tier (the CI tier's tests) into
# tier_run (per test binary, its tests' names joined by |), tier_tests (one
# "binary test" each) and KM_PKGS (the packages whose test binaries hold
# them, in the order the tier names them).
km_tier_read() {
  declare -gA tier_run=()
  tier_tests=()
  local pkgs=() pkg test bin _
  while read -r pkg test _; do
    case "$pkg" in ''|'#'*) continue ;; esac
    [ -n "$test" ] || km_die "tier: package $pkg has no test name"
    bin=$(echo "${pkg#./}" | tr / _)
    [ -n "${tier_run[$bin]:-}" ] || pkgs+=("$pkg")
    tier_run[$bin]="${tier_run[$bin]:+${tier_run[$bin]}|}$test"
    tier_tests+=("$bin $test")
  done <"$KM_DIR/tier"
  KM_PKGS="${pkgs[*]}"
}

# km_guest_script MODE TIER OUT writes the guest's steps (guest-steps.sh)
# with their settings: MODE (full or doctor), and with TIER=1 the tier's
# shared load (DEPTRACE_TEST_SHARED_LOAD=1) and -test.run patterns (from
# km_tier_read). KMATRIX_TEST_TIMEOUT: go test -test.timeout per binary
# (default 900 in the tier, else 2700: 7.3's ./tracer alone ran past 25 min under TCG).
km_guest_script() {
  local mode=$1 tier=$2 out=$3 bin
  {
    echo "MODE=$mode"
    # The tier's tracer tests share one load of the kernel side (tier).
    [ "$tier" -eq 1 ] && echo "export DEPTRACE_TEST_SHARED_LOAD=1"
    echo "TEST_TIMEOUT=${KMATRIX_TEST_TIMEOUT:-$([ "$tier" -eq 1 ] && echo 900 || echo 2700)}"
    # testrun BINARY prints the -test.run pattern of BINARY (empty: every test).
    echo 'testrun() { case "$1" in'
    if [ "$tier" -eq 1 ]; then
      for bin in "${!tier_run[@]}"; do echo "  $bin) echo '^(${tier_run[$bin]})\$' ;;"; done
    fi
    echo '  *) echo "" ;; esac; }'
    cat "$KM_DIR/guest-steps.sh"
  } >"$out"
}

# km_tier_check ABI ROWS appends to ROWS (parse.awk's rows of one kernel) a
# FAIL row for each test of the tier that skipped or never ran: a tier test
# exists to run its hook path, so a renamed test or a pattern that matches
# nothing fails here, not silently. It sets KM_TIER_MISSED to how many.
km_tier_check() {
  local abi=$1 rows=$2 bt bin test
  KM_TIER_MISSED=0
  for bt in "${tier_tests[@]}"; do
    bin=${bt% *}; test=${bt#* }
    if grep -Eq "^KERNEL +[^ ]+ +$bin +$test +SKIP" "$rows"; then
      printf 'KERNEL %-28s %-18s %-52s FAIL  (in scripts/kernel-matrix/tier but skipped)\n' "$abi" "$bin" "$test" >>"$rows"
      KM_TIER_MISSED=$((KM_TIER_MISSED + 1))
    elif ! grep -Eq "^KERNEL +[^ ]+ +$bin +$test +(PASS|FAIL)" "$rows"; then
      printf 'KERNEL %-28s %-18s %-52s FAIL  (in scripts/kernel-matrix/tier but never ran)\n' "$abi" "$bin" "$test" >>"$rows"
      KM_TIER_MISSED=$((KM_TIER_MISSED + 1))
    fi
  done
}

package kernel

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Prepare checks what must hold before anything is loaded: BPF maps can be
// created. Kernels before 5.11 charge them to RLIMIT_MEMLOCK: the limit is
// raised, which needs CAP_SYS_RESOURCE or a high enough hard limit.
func Prepare() error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("this kernel charges BPF maps to the locked-memory limit (Linux before 5.11) and raising it failed (%v): run deptrace with `ulimit -l unlimited` (LimitMEMLOCK=infinity under systemd)", err)
	}
	return nil
}

// TooOld turns a verifier rejection that means "this kernel predates a BPF
// feature deptrace needs" into one line naming the feature and the first
// Linux release with it; "" when the log says nothing of the kind. The
// verifier's wording is the probe: it names the instruction it does not
// know, whatever the kernel's version number says.
func TooOld(verifierLog string) string {
	switch {
	case strings.Contains(verifierLog, "BPF_STX uses reserved fields"),
		strings.Contains(verifierLog, "BPF_XADD uses reserved fields"):
		return "this kernel's BPF verifier has no atomic exchange or compare-and-exchange, which arrived in Linux 5.12; deptrace needs Linux 5.12 or newer (6.1 and newer are tested, see docs/install.md)"
	case strings.Contains(verifierLog, "unknown func bpf_sk_storage_get"):
		return "this kernel cannot use socket-local storage from tracing programs, which arrived in Linux 5.11; deptrace needs Linux 5.12 or newer (6.1 and newer are tested, see docs/install.md)"
	}
	return ""
}

// TooOldForMaps turns a map that this kernel refused to create into one
// line naming the release deptrace needs, where the running release is
// older than that (Debian's 5.10 refuses the task-storage map that
// recovers skipped program runs, EINVAL); "" otherwise.
func TooOldForMaps(err error) string {
	var u unix.Utsname
	if err == nil || unix.Uname(&u) != nil {
		return ""
	}
	release := unix.ByteSliceToString(u.Release[:])
	if major, minor, ok := ParseRelease(release); !ok || major > 5 || (major == 5 && minor >= 12) {
		return ""
	}
	return fmt.Sprintf("this kernel (%s) refused one of deptrace's maps (%v): it predates Linux 5.12, which deptrace needs (atomic compare-and-exchange in BPF programs, 5.12; 6.1 and newer are tested, see docs/install.md)", release, err)
}

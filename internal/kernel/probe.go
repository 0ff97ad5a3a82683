// Package kernel probes what the running kernel and process allow:
// capabilities, BTF, the cgroup v2 root. Loaders of BPF objects share it;
// every probe is cached once.
package kernel

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// Linux capability numbers (include/uapi/linux/capability.h).
const (
	capDacOverride = 1
	capSysPtrace   = 19
	capNetAdmin    = 12
	capSysAdmin    = 21
	capPerfmon     = 38
	capBPF         = 39
)

var capNames = map[int]string{
	capNetAdmin: "CAP_NET_ADMIN",
	capSysAdmin: "CAP_SYS_ADMIN",
	capPerfmon:  "CAP_PERFMON",
	capBPF:      "CAP_BPF",
}

// ErrNoBTF is returned when the kernel exposes no BTF: every deptrace
// program is a BTF-typed (tp_btf, iterator) program.
var ErrNoBTF = errors.New("the kernel has no BTF (/sys/kernel/btf/vmlinux missing): deptrace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y")

// ErrCapability names a capability the process lacks.
type ErrCapability struct{ Missing []string }

func (e *ErrCapability) Error() string {
	return fmt.Sprintf("missing capability %s: run deptrace as root or grant CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN and CAP_SYS_ADMIN", strings.Join(e.Missing, ", "))
}

// CheckCapabilities reports the capabilities deptrace needs and the
// process lacks: CAP_BPF and CAP_PERFMON to load tracing programs,
// CAP_NET_ADMIN to attach cgroup socket hooks, CAP_SYS_ADMIN to enter other
// network namespaces and to switch on program statistics.
func CheckCapabilities() error {
	eff, err := effectiveCaps()
	if err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	var missing []string
	for _, c := range []int{capBPF, capPerfmon, capNetAdmin, capSysAdmin} {
		if eff&(1<<c) == 0 {
			missing = append(missing, capNames[c])
		}
	}
	if len(missing) > 0 {
		return &ErrCapability{Missing: missing}
	}
	return nil
}

// Optional is a capability deptrace runs without, losing what Loses says.
type Optional struct {
	Name  string
	Loses string
	// PinsOnly: only a process that pins its kernel side (the agent)
	// loses anything without it.
	PinsOnly bool
}

// optionalCaps are the capabilities deptrace can start without (README,
// "Run it"), in the order they are reported.
var optionalCaps = []struct {
	c int
	Optional
}{
	{capSysPtrace, Optional{Name: "CAP_SYS_PTRACE", Loses: "network namespaces found only through processes deptrace may not inspect (other users' or non-dumpable ones: containers) are missed at start, with their listeners and open connections, and listeners older than deptrace in them are not named"}},
	{capDacOverride, Optional{Name: "CAP_DAC_OVERRIDE", PinsOnly: true, Loses: "not root: the agent cannot pin its kernel side under root's bpffs (/sys/fs/bpf); run it with --pin-path \"\" and lose the counts between a crash and the restart"}},
}

// MissingOptional lists the optional capabilities the process lacks (none
// when its capabilities cannot be read: CheckCapabilities says why).
func MissingOptional() []Optional {
	eff, err := effectiveCaps()
	if err != nil {
		return nil
	}
	var out []Optional
	for _, o := range optionalCaps {
		if o.c == capDacOverride && os.Geteuid() == 0 {
			continue // root owns bpffs: no override needed
		}
		if eff&(1<<o.c) == 0 {
			out = append(out, o.Optional)
		}
	}
	return out
}

func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }() // read-only
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no CapEff line in /proc/self/status")
}

// BTF is the running kernel's BTF, loaded once.
var BTF = sync.OnceValues(func() (*btf.Spec, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoBTF, err)
	}
	return spec, nil
})

// Has reports whether the kernel's BTF names a type of this name:
// tracepoints (btf_trace_*), kfuncs and iterator contexts all leave one.
func Has(name string) bool {
	spec, err := BTF()
	if err != nil {
		return false
	}
	_, err = spec.AnyTypeByName(name)
	return err == nil
}

// HasMember reports whether the kernel's BTF has a struct of this name
// with a member of that name.
func HasMember(structName, member string) bool {
	spec, err := BTF()
	if err != nil {
		return false
	}
	var st *btf.Struct
	if err := spec.TypeByName(structName, &st); err != nil {
		return false
	}
	for _, m := range st.Members {
		if m.Name == member {
			return true
		}
	}
	return false
}

// CgroupV2Root finds the cgroup v2 mount point from mountinfo. On hybrid
// hosts it is often /sys/fs/cgroup/unified, on unified ones /sys/fs/cgroup.
func CgroupV2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	defer func() { _ = f.Close() }() // read-only
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent major:minor root mountpoint opts ... - fstype source superopts
		fields := strings.Fields(s.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return fields[4], nil
			}
		}
	}
	return "", errors.New("no cgroup v2 hierarchy mounted")
}

// MountTracefs makes sure tracefs is mounted where classic tracepoints are
// looked up (/sys/kernel/tracing or /sys/kernel/debug/tracing), mounting it
// at /sys/kernel/tracing when neither is, as systemd does at boot.
func MountTracefs() error {
	for _, p := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.TRACEFS_MAGIC {
			return nil
		}
	}
	if err := unix.Mount("tracefs", "/sys/kernel/tracing", "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("tracefs is not mounted and mounting it at /sys/kernel/tracing failed: %w", err)
	}
	return nil
}

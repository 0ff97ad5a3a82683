// Package testnet builds throwaway hosts for privileged tests: network
// namespaces joined by veth pairs to a bridge that lives in a namespace of
// its own, so nothing touches the machine's real interfaces. Addresses come
// from the documentation ranges 198.51.100.0/24 (TEST-NET-2) and 2001:db8::/64 and exist
// only inside those namespaces.
package testnet

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/netns"
)

// Host is one network namespace with one interface on the test bridge.
type Host struct {
	Name  string // ip-netns name
	Path  string // /var/run/netns/NAME
	Inode uint32
	IPv4  net.IP
	IPv6  net.IP
}

// Network is a bridge and the hosts attached to it.
type Network struct {
	Bridge string
	Hosts  []*Host
}

var seq atomic.Uint32

// RequireRoot skips on a laptop without root, but fails under CI=true:
// CI runs as root and must never pass by skipping a privileged test.
//
// It also makes this test binary the only one on the machine running
// privileged tests: go test runs packages in parallel, and privileged
// tests share one kernel (its BPF programs, socket tables, CPU time), so
// two packages' tests must never overlap. The lock is taken at the first
// privileged test and held until the binary exits (the kernel drops it
// then, even after a crash).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Getenv(UnitOnlyEnv) == "1" {
		if UnderCI() {
			t.Fatal("privileged test: " + UnitOnlyEnv + "=1 and CI are both set: CI must run every privileged test")
		}
		t.Skip("privileged test: skipped by " + UnitOnlyEnv + "=1 (make test-unit)")
	}
	if os.Geteuid() != 0 {
		if UnderCI() {
			t.Fatal("privileged test: CI must run as root")
		}
		t.Skip("privileged test: needs root")
	}
	if err := lockMachine(); err != nil {
		t.Fatal(err)
	}
}

// UnderCI reports whether the tests run in CI: CI set to anything but
// "", "0" or "false" (CI systems set it to "true" or "1"). There a test
// that cannot run fails instead of skipping.
func UnderCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "0" && v != "false"
}

// UnitOnlyEnv set to 1 skips every privileged test, even as root: `make
// test-unit` runs the unprivileged tests alone, in seconds, with no root and
// nothing installed. CI never sets it.
const UnitOnlyEnv = "DEPTRACE_TEST_UNIT"

// LockPath is the file whose exclusive flock serialises privileged test
// binaries across packages (and across checkouts on one machine).
const LockPath = "/run/deptrace-privileged-tests.lock"

var (
	lockOnce sync.Once
	lockErr  error
	// lockFile keeps the lock's file reachable: an unreachable *os.File is
	// closed by its finalizer at the next garbage collection, and the
	// flock goes with it (two packages then ran on the kernel at once).
	lockFile *os.File //nolint:unused // only written: holding it is the point
)

func lockMachine() error {
	lockOnce.Do(func() {
		f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			lockErr = fmt.Errorf("privileged test lock: %w", err)
			return
		}
		// Blocks while another package's privileged tests run; never
		// closed, so held for the life of this process.
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			lockErr = fmt.Errorf("privileged test lock %s: %w", LockPath, err)
			_ = f.Close() // the flock's error is the one to report
			return
		}
		lockFile = f
		removeStaleTestPins()
		removeStaleTestNamespaces()
	})
	return lockErr
}

// staleNamespace matches the namespaces New names: dt<pid>-<n>-br and
// dt<pid>-<n>-h<i>.
var staleNamespace = regexp.MustCompile(`^dt([0-9]+)-[0-9]+-(br|h[0-9]+)$`)

// removeStaleTestNamespaces removes the namespaces of test processes that
// died without their cleanup, and kills what still runs in them (a killed
// test leaves its nginx or gunicorn behind). Left, they keep the
// addresses every test uses (198.51.100.x), and a tracer that sees the
// whole machine finds a second host with the same address. Holding the
// machine lock, no other privileged test binary runs: every such
// namespace but this process's is stale.
func removeStaleTestNamespaces() {
	entries, err := os.ReadDir(netns.NamedDir)
	if err != nil {
		return // no named namespaces at all
	}
	self := strconv.Itoa(os.Getpid() % 100000)
	for _, e := range entries {
		m := staleNamespace.FindStringSubmatch(e.Name())
		if m == nil || m[1] == self {
			continue
		}
		if out, err := exec.Command("ip", "netns", "pids", e.Name()).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL) // a leftover daemon of a dead test
				}
			}
		}
		_ = ip("netns", "del", e.Name()) // best effort: a namespace that stays is only in the way
	}
}

// testPins are the bpffs paths where privileged tests pin kernel sides.
var testPins = []string{"/sys/fs/bpf/deptrace-test-*", "/sys/fs/bpf/deptrace-bundler-test-*", "/sys/fs/bpf/deptrace-bundler-bench-*"}

// removeStaleTestPins removes kernel sides pinned by test processes that
// died without their cleanup (killed by a timeout, or by hand). Left, such
// a side keeps tracing every socket of the machine, slowing every later
// test and benchmark until the next reboot. Holding the machine lock, no
// other privileged test binary runs, so every test pin but this process's
// is stale (a test binary in a container with its own /run but this
// bpffs would not be serialised by the lock: none is run that way).
func removeStaleTestPins() {
	mine := fmt.Sprintf("-%d", os.Getpid())
	for _, pattern := range testPins {
		dirs, _ := filepath.Glob(pattern)
		for _, dir := range dirs {
			if strings.HasSuffix(dir, mine) || strings.Contains(dir, mine+"-") {
				continue
			}
			// Unpinning the links detaches the programs: the dead process
			// held no other reference to them.
			_ = os.RemoveAll(dir) // best-effort cleanup of a dead process's pins
		}
	}
}

func ip(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// New creates n hosts (198.51.100.1.., 2001:db8::1..) on a fresh bridge and
// removes everything when the test ends.
func New(t testing.TB, n int) *Network {
	t.Helper()
	RequireRoot(t)
	if n < 1 || n > 200 {
		t.Fatalf("testnet: %d hosts: allowed 1 to 200", n)
	}
	id := fmt.Sprintf("dt%d-%d", os.Getpid()%100000, seq.Add(1))
	nw := &Network{Bridge: id + "-br"}
	t.Cleanup(func() {
		for _, h := range nw.Hosts {
			_ = ip("netns", "del", h.Name)
		}
		_ = ip("netns", "del", nw.Bridge)
	})
	must := func(args ...string) {
		t.Helper()
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("netns", "add", nw.Bridge)
	must("-n", nw.Bridge, "link", "add", "br0", "type", "bridge")
	must("-n", nw.Bridge, "link", "set", "br0", "up")
	for i := 1; i <= n; i++ {
		h := &Host{
			Name: fmt.Sprintf("%s-h%d", id, i),
			IPv4: net.IPv4(198, 51, 100, byte(i)).To4(),
			IPv6: net.ParseIP(fmt.Sprintf("2001:db8::%x", i)),
		}
		h.Path = netns.NamedDir + "/" + h.Name
		nw.Hosts = append(nw.Hosts, h)
		must("netns", "add", h.Name)
		port := fmt.Sprintf("p%d", i)
		must("link", "add", "eth0", "netns", h.Name, "type", "veth", "peer", "name", port, "netns", nw.Bridge)
		must("-n", h.Name, "addr", "add", h.IPv4.String()+"/24", "dev", "eth0")
		must("-n", h.Name, "addr", "add", h.IPv6.String()+"/64", "dev", "eth0", "nodad")
		must("-n", h.Name, "link", "set", "eth0", "up")
		must("-n", h.Name, "link", "set", "lo", "up")
		must("-n", nw.Bridge, "link", "set", port, "master", "br0")
		must("-n", nw.Bridge, "link", "set", port, "up")
		ino, err := netns.Inode(h.Path)
		if err != nil {
			t.Fatal(err)
		}
		h.Inode = ino
	}
	return nw
}

// Do runs fn inside the host's namespace; sockets fn creates stay there.
func (h *Host) Do(t testing.TB, fn func() error) {
	t.Helper()
	if err := netns.Do(h.Path, fn); err != nil {
		t.Fatalf("in %s: %v", h.Name, err)
	}
}

// Listen opens a listener inside the host.
func (h *Host) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	h.Do(t, func() (err error) { ln, err = net.Listen(network, addr); return })
	t.Cleanup(func() { ln.Close() })
	return ln
}

// ListenPacket opens a datagram socket inside the host.
func (h *Host) ListenPacket(t testing.TB, network, addr string) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	h.Do(t, func() (err error) { pc, err = net.ListenPacket(network, addr); return })
	t.Cleanup(func() { pc.Close() })
	return pc
}

// Dial connects from inside the host, with a bounded timeout.
func (h *Host) Dial(network, addr string) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(h.Path, func() (err error) {
		c, err = net.DialTimeout(network, addr, 5*time.Second)
		return
	})
	return c, err
}

// Command runs a program inside the host (ip netns exec).
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

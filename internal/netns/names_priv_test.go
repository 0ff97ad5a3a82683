package netns_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/internal/testnet"
)

// The tables name the host's own namespace "host", a namespace of `ip
// netns` by its name, and give way to that name where `ip netns` names the
// host's own too.
func TestDisplayNames(t *testing.T) {
	testnet.RequireRoot(t)
	host, err := netns.Self()
	if err != nil {
		t.Fatal(err)
	}
	h := testnet.New(t, 1).Hosts[0]
	// A run killed before its cleanup left its name on the host's
	// namespace: remove it (an unmount; nothing is killed).
	stale, _ := filepath.Glob(filepath.Join(netns.NamedDir, "deptrace-test-host-*"))
	for _, path := range stale {
		_ = exec.Command("ip", "netns", "delete", filepath.Base(path)).Run()
	}
	names := netns.DisplayNames()
	if got := names[host]; got != netns.HostName {
		t.Errorf("the host's namespace %d reads %q; want %q", host, got, netns.HostName)
	}
	if got := names[h.Inode]; got != h.Name {
		t.Errorf("a test namespace %d reads %q; want its ip netns name %q", h.Inode, got, h.Name)
	}

	// `ip netns attach` names the host's namespace: that name wins. (Not
	// a name testnet's stale-namespace sweep matches: it kills what runs
	// in the namespaces it removes.)
	name := fmt.Sprintf("deptrace-test-host-%d", os.Getpid())
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", name).Run() })
	if out, err := exec.Command("ip", "netns", "attach", name, fmt.Sprint(os.Getpid())).CombinedOutput(); err != nil {
		t.Fatalf("ip netns attach %s (this process): %v: %s", name, err, out)
	}
	if got := netns.DisplayNames()[host]; got != name {
		t.Errorf("the host's namespace, named by ip netns, reads %q; want %q", got, name)
	}
}

// A namespace held only by a bind mount outside /var/run/netns (Docker's
// /run/docker/netns, a runtime's own directory) is listed, under the
// mount's path; one that only a thread is in, which the seed and the
// harvest could not enter, is refused with the reason.
func TestNamespacesHeldOutsideIPNetns(t *testing.T) {
	testnet.RequireRoot(t)
	name := fmt.Sprintf("deptrace-test-bind-%d", os.Getpid())
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", name).Run() })
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	ino, err := netns.Inode(filepath.Join(netns.NamedDir, name))
	if err != nil {
		t.Fatal(err)
	}
	// A space in the path: mountinfo escapes it as \040.
	held := filepath.Join(t.TempDir(), "held here")
	if err := os.WriteFile(held, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", filepath.Join(netns.NamedDir, name), held).CombinedOutput(); err != nil {
		t.Fatalf("mount --bind: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", held).Run() })
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns delete %s: %v: %s", name, err, out)
	}
	list, err := netns.List()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(list, func(ns netns.Namespace) bool { return ns.Inode == ino })
	if i < 0 || list[i].Path != held {
		t.Errorf("namespace %d held at %q: listed as %+v, want it at that path", ino, held, list)
	}
	if got, err := netns.Resolve(fmt.Sprint(ino)); err != nil || got != ino {
		t.Errorf("--netns %d (held by a bind mount): %d, %v", ino, got, err)
	}

	// A thread of this process alone in a new namespace: not the
	// thread-group leader, whose namespace /proc/PID/ns/net shows (a
	// goroutine that lands on it keeps it locked and another tries).
	threadIno := make(chan uint32)
	done := make(chan struct{})
	defer close(done)
	var tino uint32
	var threadPath string // written before its inode is sent
	for try := 0; try < 10 && tino == 0; try++ {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if unix.Gettid() == os.Getpid() {
				threadIno <- 0
				<-done
				return
			}
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				t.Errorf("unshare: %v", err)
				threadIno <- 0
				return
			}
			threadPath = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
			n, err := netns.Inode(threadPath)
			if err != nil {
				t.Error(err)
			}
			threadIno <- n
			<-done
		}()
		tino = <-threadIno
	}
	if tino == 0 {
		t.Fatal("no thread of this process outside the thread-group leader in 10 tries")
	}
	// Refused (nothing could enter it to seed or harvest), saying why,
	// by inode or by the thread's own path.
	for _, v := range []string{fmt.Sprintf("net:[%d]", tino), fmt.Sprint(tino), threadPath} {
		if _, err := netns.Resolve(v); err == nil || !strings.Contains(err.Error(), "only a thread is in that namespace (/proc/") {
			t.Errorf("--netns %s (only a thread in it): %v; want the refusal that says only a thread is in it", v, err)
		}
	}
}

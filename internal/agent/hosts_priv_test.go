package agent

import (
	"fmt"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/internal/testnet"
)

// namespaceHolder is a process alone in a network namespace of its own,
// its loopback up with addr on it.
type namespaceHolder struct {
	cmd  *exec.Cmd
	ino  uint32
	path string
}

func holdNamespace(t *testing.T, addr string) *namespaceHolder {
	t.Helper()
	self, err := netns.Self()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--net", "sh", "-c", "ip addr add "+addr+"/32 dev lo && ip link set lo up && exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatalf("unshare --net: %v", err)
	}
	h := &namespaceHolder{cmd: cmd, path: fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)}
	t.Cleanup(h.stop)
	for range 200 { // until sleep runs: the namespace made and its address set
		if comm, err := exec.Command("ps", "-o", "comm=", "-p", fmt.Sprint(cmd.Process.Pid)).Output(); err == nil && string(comm) == "sleep\n" {
			if h.ino, err = netns.Inode(h.path); err == nil && h.ino != self {
				return h
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("unshare --net (pid %d) did not reach its sleep in 2 s", cmd.Process.Pid)
	return nil
}

func (h *namespaceHolder) stop() {
	if h.cmd.ProcessState == nil {
		_ = h.cmd.Process.Signal(syscall.SIGKILL)
		_ = h.cmd.Wait() // killed: its exit status says so
	}
}

func (h *namespaceHolder) cookie(t *testing.T) uint64 {
	t.Helper()
	c, err := netns.CookieOf(h.ino)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The kernel gives a freed namespace inode to the next namespace it
// makes, so a container's namespace often has the inode of one that just
// ended. Its host is another, and holds its own addresses: not the last
// one's id, nor (from a name cached for 30 s) the last one's addresses.
// A namespace that ended keeps its id for the flows drained after its end,
// with no addresses: nothing holds them any more.
func TestHostIDOutlivesTheNamespacesInode(t *testing.T) {
	testnet.RequireRoot(t)
	ids, err := newHostIDs("reusetest")
	if err != nil {
		t.Fatal(err)
	}
	first := holdNamespace(t, "192.0.2.77")
	was := ids.host(first.ino)
	if want := NamespaceHostID("reusetest", first.ino, first.cookie(t)); was.ID != want || !slices.Contains(was.Addrs, "192.0.2.77") {
		t.Fatalf("first namespace: id %q, addresses %v; want %q holding 192.0.2.77", was.ID, was.Addrs, want)
	}
	first.stop()

	// The next namespace made takes the lowest free inode: hold every one
	// that did not get the first's, until one does (another test's
	// namespace may take it first; the holders fill the lower holes).
	var second *namespaceHolder
	deadline := time.Now().Add(20 * time.Second)
	for attempt := 0; second == nil; attempt++ {
		if attempt == 100 || time.Now().After(deadline) {
			t.Fatalf("no new namespace took inode %d in %d attempts: other namespaces on this machine took it", first.ino, attempt)
		}
		if h := holdNamespace(t, "192.0.2.78"); h.ino == first.ino {
			second = h
		}
	}
	now := ids.host(first.ino) // within the 30 s its name is cached for
	if want := NamespaceHostID("reusetest", first.ino, second.cookie(t)); now.ID != want || now.ID == was.ID {
		t.Errorf("namespace that took inode %d: id %q; want %q (the last one's was %q)", first.ino, now.ID, want, was.ID)
	}
	if !slices.Contains(now.Addrs, "192.0.2.78") || slices.Contains(now.Addrs, "192.0.2.77") {
		t.Errorf("namespace that took inode %d holds %v; want 192.0.2.78, not the last one's 192.0.2.77", first.ino, now.Addrs)
	}

	second.stop()
	ids.nextDrain()
	gone := ids.host(first.ino)
	if gone.ID != now.ID || len(gone.Addrs) != 0 {
		t.Errorf("ended namespace: id %q, addresses %v; want its id %q and no address", gone.ID, gone.Addrs, now.ID)
	}
}

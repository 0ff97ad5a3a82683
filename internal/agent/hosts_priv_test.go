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

// takenByOther reports whether a namespace none of ours holds has inode
// ino.
func takenByOther(t *testing.T, ino uint32, ours []*namespaceHolder) bool {
	t.Helper()
	list, err := netns.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range list {
		if ns.Inode == ino {
			return !slices.ContainsFunc(ours, func(h *namespaceHolder) bool { return h.ino == ino })
		}
	}
	return false
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
	// The next namespace made takes the lowest free inode: hold every one
	// that did not get the ended one's, until one does (the holders fill
	// the lower holes). A namespace of something else on the machine may
	// take it first: then start over, a few times at most.
	var first, second *namespaceHolder
	var was hostInfo
	for round := 0; second == nil; round++ {
		if round == 5 {
			t.Fatalf("in 5 tries, another namespace on this machine took each ended one's inode first")
		}
		first = holdNamespace(t, "192.0.2.77")
		ids.nextDrain()
		was = ids.host(first.ino)
		if want := NamespaceHostID("reusetest", first.ino, first.cookie(t)); was.ID != want || !slices.Contains(was.Addrs, "192.0.2.77") {
			t.Fatalf("first namespace: id %q, addresses %v; want %q holding 192.0.2.77", was.ID, was.Addrs, want)
		}
		first.stop()
		var held []*namespaceHolder
		for attempt := 0; attempt < 50 && second == nil; attempt++ {
			h := holdNamespace(t, "192.0.2.78")
			if h.ino == first.ino {
				second = h
				break
			}
			held = append(held, h)
			if takenByOther(t, first.ino, held) {
				break
			}
		}
		for _, h := range held {
			h.stop()
		}
	}
	ids.nextDrain()
	now := ids.host(first.ino) // the next drain, within the 30 s a name is cached for
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
	// A drain later, flows with its inode are another namespace's, one
	// that came and went unseen (a one-shot container): the inode alone
	// names them, not the last one's id.
	ids.nextDrain()
	if unseen := ids.host(first.ino); unseen.ID != NamespaceHostID("reusetest", first.ino, 0) {
		t.Errorf("the drain after the one that found it gone: id %q, want the inode's alone", unseen.ID)
	}

	// A namespace that ends idle (no flow asks for it in the drains
	// around its end) is found gone by the drains' sweep: flows with its
	// inode, drains later, are not named after it.
	third := holdNamespace(t, "192.0.2.79")
	ids.nextDrain()
	if id := ids.host(third.ino).ID; id != NamespaceHostID("reusetest", third.ino, third.cookie(t)) {
		t.Fatalf("third namespace: id %q", id)
	}
	third.stop()
	for range 3 {
		ids.nextDrain()
	}
	if later := ids.host(third.ino); later.ID != NamespaceHostID("reusetest", third.ino, 0) || len(later.Addrs) != 0 {
		t.Errorf("flows with an idle ended namespace's inode, drains later: id %q, addresses %v; want the inode's alone, none", later.ID, later.Addrs)
	}
}

package netns_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

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

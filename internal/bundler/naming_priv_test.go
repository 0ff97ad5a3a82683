package bundler

import (
	"io"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/testnet"
)

// A server's connection that opens and closes after the programs attach
// but before seeding has put its listener (older than deptrace) in the
// port table is counted unnamed by the kernel side; the drain names it
// from the table as seeding left it: the listening process, as the
// programs name every other server flow.
func TestServerFlowBeforeSeedingIsNamed(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":7210") // before deptrace

	bu, err := Load(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer bu.Close()

	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		_, err = io.Copy(io.Discard, c) // until the client's FIN
		c.Close()
		served <- err
	}()
	c, err := a.Dial("tcp4", b.IPv4.String()+":7210")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-served; err != nil {
		t.Fatal(err)
	}

	if _, err := bu.Seed(); err != nil {
		t.Fatal(err)
	}
	entries, _, err := bu.Drain()
	if err != nil {
		t.Fatal(err)
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, e := range entries {
		if e.NetNS != b.Inode || e.Port != 7210 || e.Proto != unix.IPPROTO_TCP || e.Direction != DirInbound {
			continue
		}
		found = true
		if e.Connections != 1 || e.BytesReceived != 5 {
			t.Errorf("server flow %+v: want 1 connection, 5 bytes received", e)
		}
		if e.PID != uint32(os.Getpid()) || e.Comm != strings.TrimSpace(string(comm)) || e.CgroupID == 0 {
			t.Errorf("server flow named %d/%q (cgroup %d), want the listening process %d/%q and its cgroup", e.PID, e.Comm, e.CgroupID, os.Getpid(), strings.TrimSpace(string(comm)))
		}
	}
	if !found {
		t.Fatalf("no server flow on port 7210 in %d entries", len(entries))
	}
}

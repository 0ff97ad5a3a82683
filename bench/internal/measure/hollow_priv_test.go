package measure

import (
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/testnet"
)

// The hollow side puts an empty program on every hook deptrace runs per
// event on this kernel, and those programs really run for the sockets
// deptrace's own would: a floor measured on hooks that never fire would
// say nothing.
func TestHollowRunsWhereDeptraceRuns(t *testing.T) {
	testnet.RequireRoot(t)
	hooks, err := perEventHooks()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"inet_sock_set_state", "sock_release"} {
		if !strings.Contains(strings.Join(hooks, " "), want) {
			t.Fatalf("deptrace's per-event hooks %v lack %s", hooks, want)
		}
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	h, err := AttachHollow(hooks)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if len(h.Hooks) != len(hooks) {
		t.Fatalf("empty programs on %v, want one on each of %v", h.Hooks, hooks)
	}

	// One TCP connection over loopback, with a byte each way, then closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			buf := make([]byte, 1)
			if _, err = c.Read(buf); err == nil {
				_, err = c.Write(buf)
			}
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}

	for _, hook := range h.Hooks {
		// The hooks a TCP exchange must reach, tracepoints or (before
		// 6.3) their fexit fallbacks.
		perConn := slices.Contains([]string{"tp_btf/inet_sock_set_state", "cgroup/sock_release",
			"tp_btf/sock_send_length", "tp_btf/sock_recv_length", "fexit/inet_sendmsg", "fexit/sock_recvmsg"}, hook)
		if !perConn {
			continue
		}
		runs, err := h.Runs(hook)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d runs", hook, runs)
		if runs == 0 {
			t.Errorf("the empty program on %s never ran for a TCP connection", hook)
		}
	}
	h.Close()
	if len(h.Hooks) != 0 {
		t.Errorf("hooks left after Close: %v", h.Hooks)
	}
}

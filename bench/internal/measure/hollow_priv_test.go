package measure

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/kernel"
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

// shortConnections makes n short-lived TCP connections over loopback, as
// the tcp-short load does: connect, 64 bytes each way, the client closes
// first, then the server.
func shortConnections(t *testing.T, n int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			c, err := ln.Accept()
			if err != nil {
				served <- err
				return
			}
			buf := make([]byte, 64)
			if _, err = io.ReadFull(c, buf); err == nil {
				_, err = c.Write(buf)
			}
			if err == nil {
				_, err = c.Read(buf) // EOF: the client closed
				if err == io.EOF {
					err = nil
				}
			}
			c.Close()
			if err != nil {
				served <- err
				return
			}
		}
		served <- nil
	}()
	buf := make([]byte, 64)
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// Every alternative hook set attaches on this kernel, its TCP hooks run
// for short-lived connections, and the runs per connection of each set
// are logged (go test -v -run TestHollowSetRuns): the figures of
// docs/performance.md's hook-set table. Other processes' sockets on the
// machine add to the cgroup hooks' counts: run it on a quiet machine.
func TestHollowSetRuns(t *testing.T) {
	testnet.RequireRoot(t)
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	const conns = 500
	today, err := perEventHooks()
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range HollowSetNames() {
		h, err := AttachHollow(hollowSetOf(set, today))
		if err != nil {
			t.Fatalf("%s: %v", set, err)
		}
		shortConnections(t, conns)
		runs, ns, err := h.Stats()
		if err != nil {
			h.Close()
			t.Fatal(err)
		}
		var total, totalNs uint64
		var per []string
		tcpRuns := uint64(0)
		for i, hook := range h.Hooks {
			total += runs[i]
			totalNs += ns[i]
			if runs[i] > 0 {
				per = append(per, fmt.Sprintf("%s %.2f", hook, float64(runs[i])/conns))
			}
			if hook == tcpStateHook || strings.HasPrefix(hook, "cgroup/sockops") {
				tcpRuns += runs[i]
			}
		}
		t.Logf("%s: %.2f runs and %.0f ns (bpf_stats, empty programs) per connection: %s", set, float64(total)/conns, float64(totalNs)/conns, strings.Join(per, ", "))
		h.Close()
		if tcpRuns < conns {
			t.Errorf("%s: the TCP state hook ran %d times for %d connections", set, tcpRuns, conns)
		}
		// Each program on tcp_destroy_sock sees both ends of every
		// connection freed, but the last connection's ends may still be
		// finishing their close when the counts are read.
		for i, hook := range h.Hooks {
			if hook == tcpDestroyHook && runs[i] < 2*conns-2 {
				t.Errorf("%s: a program on %s ran %d times for %d connections, want at least %d", set, hook, runs[i], conns, 2*conns-2)
			}
		}
	}
}

// sockOpsNames are the sockops operations, by number (uapi bpf.h).
var sockOpsNames = []string{"VOID", "TIMEOUT_INIT", "RWND_INIT", "TCP_CONNECT_CB", "ACTIVE_ESTABLISHED_CB",
	"PASSIVE_ESTABLISHED_CB", "NEEDS_ECN", "BASE_RTT", "RTO_CB", "RETRANS_CB", "STATE_CB", "TCP_LISTEN_CB",
	"RTT_CB", "PARSE_HDR_OPT_CB", "HDR_OPT_LEN_CB", "WRITE_HDR_OPT_CB"}

// Which sockops callbacks a short-lived connection runs, with no callback
// enabled: where the sockops hook set's runs go (logged; docs/performance.md).
func TestSockOpsCallbacksPerConnection(t *testing.T) {
	testnet.RequireRoot(t)
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer counts.Close()
	// counts[op]++ for op < 16; return 1.
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SockOps, AttachType: ebpf.AttachCGroupSockOps, License: "GPL",
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
			asm.JGE.Imm(asm.R2, 16, "out"),
			asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word),
			asm.LoadMapPtr(asm.R1, counts.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	root, err := kernel.CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: root, Attach: ebpf.AttachCGroupSockOps, Program: prog})
	if err != nil {
		t.Fatal(err)
	}
	const conns = 200
	shortConnections(t, conns)
	l.Close()
	var per []string
	var total uint64
	for op := uint32(0); op < 16; op++ {
		var n uint64
		if err := counts.Lookup(op, &n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			per = append(per, fmt.Sprintf("%s %.2f", sockOpsNames[op], float64(n)/conns))
			total += n
		}
	}
	t.Logf("sockops callbacks per short-lived connection (both ends), none enabled: %.2f: %s", float64(total)/conns, strings.Join(per, ", "))
	if total < conns {
		t.Errorf("sockops ran %d times for %d connections", total, conns)
	}
}

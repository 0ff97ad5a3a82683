package realsoftware_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/realtest"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// curl to a port nothing listens on (refused: an RST answers the SYN)
// and to ports an nftables rule in the server's namespace rejects with
// ICMP administratively prohibited (unreachable: curl's connect fails
// with EHOSTUNREACH, "No route to host"). The ICMP comes back two ways:
//   - port 7004, rejected at once: on veth the answer is processed while
//     curl is still inside connect() holding the socket lock, so the
//     kernel leaves the error in sk_err_soft (TcpExtLockDroppedIcmps),
//     curl reads it with getsockopt(SO_ERROR) and closes the socket;
//   - port 7006, first SYN dropped, the retransmitted one rejected: the
//     ICMP arrives with the socket unowned and the kernel closes it with
//     sk_err set (tcp_done_with_error), as for a distant router's ICMP.
func TestCurlRefusedAndUnreachable(t *testing.T) {
	realtest.NeedPrograms(t, "curl", "nft", "nstat", "ip")
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	realtest.LoadNftRuleset(t, b, `table ip deptrace_real {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport 7004 counter reject with icmp type admin-prohibited
		tcp dport 7006 tcp flags & (syn | ack) == syn numgen inc mod 2 == 0 drop
		tcp dport 7006 counter reject with icmp type admin-prohibited
	}
}
`)
	tr := startTracer(t)
	const r = 3
	cases := []struct {
		port uint16
		says string // what connect() failed with, as curl -v prints it
	}{{7005, "Connection refused"}, {7004, "No route to host"}, {7006, "No route to host"}}
	for _, c := range cases {
		for i := 0; i < r; i++ {
			code, _, errOut := realtest.Run(t, a, 20*time.Second, "curl", "-v", "-sS", "--connect-timeout", "5", "--max-time", "10",
				fmt.Sprintf("http://%s:%d/", b.IPv4, c.port))
			if code != 7 || !strings.Contains(errOut, c.says) {
				t.Fatalf("curl to port %d: exit %d; want 7 (could not connect) with %q:\n%s", c.port, code, c.says, errOut)
			}
		}
	}
	for _, port := range []string{"7004", "7006"} {
		if got := realtest.NftRulePackets(t, b, "deptrace_real", "input", "dport "+port+" counter"); got != r {
			t.Fatalf("the reject rule for port %s matched %d SYNs; want %d", port, got, r)
		}
	}
	_, mib, _ := realtest.Run(t, a, 10*time.Second, "nstat", "-az", "TcpExtLockDroppedIcmps", "TcpAttemptFails", "IcmpInDestUnreachs")
	t.Logf("client namespace counters:\n%s", mib)

	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		for _, c := range cases {
			if l.TCP(a.Inode, tracer.Outbound, c.port).FailedConnections < r {
				return false
			}
		}
		return true
	})
	t.Logf("ledger:%s", l.About([]uint32{a.Inode, b.Inode}))
	ref := l.TCP(a.Inode, tracer.Outbound, 7005)
	if ref.Connections != 0 || ref.FailedConnections != r || ref.FailedRefused != r || ref.Comm != "curl" {
		t.Errorf("refused edge: %+v named %q; want %d failed, all refused, by curl", ref.Counters, ref.Comm, r)
	}
	if ref.ResetsReceived != 0 {
		t.Errorf("refused edge: %d resets received; resets count on established connections only (docs/flows.md), "+
			"the RSTs that refused the SYNs are already counted as failed_refused", ref.ResetsReceived)
	}
	un := l.TCP(a.Inode, tracer.Outbound, 7004)
	if un.Connections != 0 || un.FailedConnections != r || un.FailedUnreachable != r || un.Comm != "curl" {
		t.Errorf("unreachable edge, port 7004: %+v named %q; want %d failed, all unreachable (curl saw No route to host), by curl",
			un.Counters, un.Comm, r)
	}
	// Port 7006 (first SYN dropped, the retransmission rejected): about one
	// run in thirty, one of the failures is reported as a timeout; the
	// interleaving is not pinned down yet (docs/flows.md). Every failure
	// is still counted, never as refused, and at most one as a timeout.
	un = l.TCP(a.Inode, tracer.Outbound, 7006)
	if un.Connections != 0 || un.FailedConnections != r || un.FailedUnreachable+un.FailedTimeout != r ||
		un.FailedUnreachable < r-1 || un.Comm != "curl" {
		t.Errorf("unreachable edge, port 7006: %+v named %q; want %d failed, at least %d unreachable, by curl",
			un.Counters, un.Comm, r, r-1)
	}
	for _, c := range cases {
		if n := l.CountTCP(b.Inode, c.port); n != 0 {
			t.Errorf("server host has %d flows on port %d that never opened", n, c.port)
		}
	}
}

// An nftables rule in the server's namespace drops every other SYN to
// nginx: each connect's first SYN is lost and the kernel retransmits it
// after its initial 1 s timeout.
func TestSYNDroppedOnceGivesOneSecondConnect(t *testing.T) {
	realtest.NeedPrograms(t, "nginx", "curl", "nft", "ip")
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	realtest.LoadNftRuleset(t, b, `table ip deptrace_real {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport 7003 tcp flags & (syn | ack) == syn numgen inc mod 2 == 0 counter drop
	}
}
`)
	tr := startTracer(t)
	startNginx(t, b, fmt.Sprintf(`	server { listen %s:7003; location / { return 204; } }`, b.IPv4))
	// The retransmitted SYN goes out from a timer, so both ends open in
	// softirq, in whatever task the CPU was running: on the CI's kernel a
	// thread of PID 1 hides them from every BPF program (initwitness.go).
	witness := tracertest.WatchOpens(t, b.IPv4, 7003)
	const n = 2
	for i := 0; i < n; i++ {
		code, out, errOut := realtest.Run(t, a, 30*time.Second, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{time_connect}",
			"--connect-timeout", "10", "--max-time", "15", fmt.Sprintf("http://%s:7003/", b.IPv4))
		if code != 0 || !strings.HasPrefix(out, "204 ") {
			t.Fatalf("curl: exit %d %q %s", code, out, errOut)
		}
		t.Logf("curl %d: status and connect time %s", i, out)
	}
	dropped := realtest.NftRulePackets(t, b, "deptrace_real", "input", "dport 7003")
	if dropped != n {
		t.Fatalf("the rule dropped %d SYNs; want %d (one per connect)", dropped, n)
	}
	// Opens the kernel hid may be missing, none other; on a kernel that
	// hides nothing (mainline) they are counted like the rest.
	hiddenClient, hiddenServer := witness.HiddenOpens(t)
	if hiddenClient > n || hiddenServer > n {
		t.Fatalf("the witness saw %d client and %d server opens hidden, of %d connections", hiddenClient, hiddenServer, n)
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return l.TCP(a.Inode, tracer.Outbound, 7003).Connections >= uint64(n-hiddenClient) && l.TCP(b.Inode, tracer.Inbound, 7003).Connections >= uint64(n-hiddenServer)
	})
	t.Logf("ledger:%s", l.About([]uint32{a.Inode, b.Inode}))
	o := l.TCP(a.Inode, tracer.Outbound, 7003)
	if o.Connections < uint64(n-hiddenClient) || o.Connections > n || o.FailedConnections != 0 || o.ConnectLatencyCount != o.Connections {
		t.Errorf("client edge: %+v; want %d connections with latency (%d of them may be missing: opened where the kernel hides them)", o.Counters, n, hiddenClient)
	}
	if o.ConnectLatencyCount > 0 && (o.ConnectLatencyMaxUs < 900_000 || o.ConnectLatencySumUs < o.ConnectLatencyCount*900_000) {
		t.Errorf("client edge latency: max %d us, sum %d us over %d; every connect waited for a SYN retransmission (about 1 s)",
			o.ConnectLatencyMaxUs, o.ConnectLatencySumUs, o.ConnectLatencyCount)
	}
	if o.Retransmits != dropped {
		t.Errorf("client edge: %d retransmits; want %d (the dropped SYNs, sent again)", o.Retransmits, dropped)
	}
	if i := l.TCP(b.Inode, tracer.Inbound, 7003); i.Connections < uint64(n-hiddenServer) || i.Connections > n {
		t.Errorf("server edge: %+v; want %d connections (%d of them may be missing: opened where the kernel hides them)", i.Counters, n, hiddenServer)
	}
}

var skmemDrops = regexp.MustCompile(`skmem:\([^)]*\bd(\d+)\)`)

// listenerDrops reads the kernel's own drop counter of a listening socket
// (sk_drops, the "d" of ss's skmem) in host h.
func listenerDrops(t *testing.T, h *testnet.Host, addr string) uint64 {
	t.Helper()
	code, out, errOut := realtest.Run(t, h, 10*time.Second, "ss", "-Hltnm", "src", addr)
	m := skmemDrops.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("ss -ltnm src %s: exit %d: %q %s", addr, code, out, errOut)
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}

// nginx listening with backlog=1, stopped (SIGSTOP) so that it never
// accepts, and 10 concurrent curls: the listener's drops, and the
// client edge's connections and timeouts as curl saw them.
func TestNginxListenerBacklogOverflow(t *testing.T) {
	realtest.NeedPrograms(t, "nginx", "curl", "ip", "ss")
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	tr := startTracer(t) // before nginx, so its listen() is seen and named
	master, worker, _ := startNginx(t, b, fmt.Sprintf(`	server { listen %s:7002 backlog=1; location / { return 204; } }`, b.IPv4))
	for _, p := range []int{worker, master} {
		if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	tracertest.Eventually(t, 5*time.Second, "nginx stopped", func() error {
		for _, p := range []int{worker, master} {
			if st, _, err := realtest.ProcStat(p); err != nil || st != 'T' {
				return fmt.Errorf("pid %d state %c (%v)", p, st, err)
			}
		}
		return nil
	})

	// Connects retried from the SYN timer open in softirq (see
	// TestSYNDroppedOnceGivesOneSecondConnect).
	witness := tracertest.WatchOpens(t, b.IPv4, 7002)
	const clients = 10
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		connected int
		results   []string
	)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, out, errOut := realtest.Run(t, a, 20*time.Second, "curl", "-sS", "-o", "/dev/null", "-w", "%{time_connect}",
				"--connect-timeout", "2", "--max-time", "3", fmt.Sprintf("http://%s:7002/", b.IPv4))
			tc, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
			mu.Lock()
			defer mu.Unlock()
			results = append(results, fmt.Sprintf("exit %d connect %q %s", code, out, strings.TrimSpace(errOut)))
			if code != 28 || err != nil { // 28: timed out, connecting or waiting for the stopped nginx
				t.Errorf("curl: exit %d, %q %s; want a timeout", code, out, errOut)
			}
			if tc > 0 {
				connected++
			}
		}()
	}
	wg.Wait()
	t.Logf("curls: %d connected; %s", connected, strings.Join(results, "; "))

	addr := b.IPv4.String() + ":7002"
	before := listenerDrops(t, b, addr)
	hidden, _ := witness.HiddenOpens(t)
	if hidden > connected {
		t.Fatalf("the witness saw %d client opens hidden; %d curls connected", hidden, connected)
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		o := l.TCP(a.Inode, tracer.Outbound, 7002)
		return o.Connections+o.FailedConnections >= uint64(clients-hidden) && l.Listener(b.Inode, 7002).Drops >= before
	})
	after := listenerDrops(t, b, addr)
	t.Logf("ledger:%s", l.About([]uint32{a.Inode, b.Inode}))
	t.Logf("listener sk_drops from ss: %d before settling, %d after", before, after)

	o := l.TCP(a.Inode, tracer.Outbound, 7002)
	if o.Connections < uint64(connected-hidden) || o.Connections > uint64(connected) || o.FailedConnections != uint64(clients-connected) || o.FailedTimeout != o.FailedConnections || o.Comm != "curl" {
		t.Errorf("client edge: %+v named %q; want %d connections (curl connected; %d of them may be missing, opened where the kernel hides them) and %d failed, all timeouts",
			o.Counters, o.Comm, connected, hidden, clients-connected)
	}
	li := l.Listener(b.Inode, 7002)
	if li.BacklogLimit != 1 || li.QueueMax < 1 || li.LocalAddr != b.IPv4.String() {
		t.Errorf("listener %s: backlog %d, deepest queue %d; want backlog 1, a queue", li.LocalAddr, li.BacklogLimit, li.QueueMax)
	}
	if li.Drops == 0 || li.Drops < before || li.Drops > after {
		t.Errorf("listener: %d drops; the socket's own counter said %d before and %d after the last drain", li.Drops, before, after)
	}
	if li.PID != uint32(master) || li.Comm != "nginx" {
		t.Errorf("listener named %d/%q; want the nginx master %d that called listen()", li.PID, li.Comm, master)
	}
}

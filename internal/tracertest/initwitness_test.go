package tracertest

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
)

func TestParseOpens(t *testing.T) {
	trace := `# tracer: nop
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
 tokio-rt-worker-75      [000] .Ns2. 25209.755253: inet_sock_set_state: family=AF_INET protocol=IPPROTO_TCP sport=55958 dport=7003 saddr=198.51.100.1 daddr=198.51.100.2 saddrv6=::ffff:198.51.100.1 daddrv6=::ffff:198.51.100.2 oldstate=TCP_SYN_SENT newstate=TCP_ESTABLISHED
     ksoftirqd/1-22      [001] ..s1. 24556.507235: inet_sock_set_state: family=AF_INET protocol=IPPROTO_TCP sport=7003 dport=58998 saddr=198.51.100.2 daddr=198.51.100.1 saddrv6=::ffff:198.51.100.2 daddrv6=::ffff:198.51.100.1 oldstate=TCP_SYN_RECV newstate=TCP_ESTABLISHED
 a name-with spaces-4242 (    1) [001] ..s1. 1.000000: inet_sock_set_state: family=AF_INET protocol=IPPROTO_TCP sport=7003 dport=1 saddr=198.51.100.2 daddr=198.51.100.9 oldstate=TCP_SYN_RECV newstate=TCP_ESTABLISHED
            curl-12      [000] ..s1. 2.000000: inet_sock_set_state: family=AF_INET protocol=IPPROTO_TCP sport=40000 dport=7003 saddr=198.51.100.1 daddr=198.51.100.3 oldstate=TCP_SYN_SENT newstate=TCP_ESTABLISHED
`
	got, err := parseOpens(bufio.NewScanner(strings.NewReader(trace)), "198.51.100.2", 7003)
	if err != nil {
		t.Fatal(err)
	}
	// The last line is a connection to another server on that port.
	want := []witnessedOpen{{task: "tokio-rt-worker", tid: 75, client: true}, {task: "ksoftirqd/1", tid: 22}, {task: "a name-with spaces", tid: 4242}}
	if len(got) != len(want) {
		t.Fatalf("got %d opens, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].task != want[i].task || got[i].tid != want[i].tid || got[i].client != want[i].client {
			t.Errorf("open %d: %q %d client %v, want %q %d client %v", i, got[i].task, got[i].tid, got[i].client, want[i].task, want[i].tid, want[i].client)
		}
	}
	init := map[int]string{75: "tokio-rt-worker", 4242: "another name"}
	isInit := func(o witnessedOpen) bool { name, ok := init[o.tid]; return ok && name == o.task }
	if c, s := hiddenOf(got, isInit); c != 1 || s != 0 {
		t.Errorf("hidden opens (thread 75 PID 1's; 4242 a reused id): %d client, %d server; want 1 and 0", c, s)
	}
	for _, bad := range []string{
		"curl [000] ..s1. 1.0: inet_sock_set_state: sport=7003 dport=2 saddr=198.51.100.2", // no thread id
		"CPU:1 [LOST 3 EVENTS]",
	} {
		if _, err := parseOpens(bufio.NewScanner(strings.NewReader(bad)), "198.51.100.2", 7003); err == nil {
			t.Errorf("parseOpens(%q): no error", bad)
		}
	}
	if !HidesInit("6.18.44-fc-v669") || HidesInit("6.12.48") {
		t.Error("HidesInit: want the -fc- kernel only")
	}
}

// PID 1's threads as the witness takes them: PID 1's main thread is one,
// this test's thread is not.
func TestInitThreads(t *testing.T) {
	threads := initThreads(t)
	if _, ok := threads[1]; !ok {
		t.Errorf("PID 1's threads %v lack thread 1", threads)
	}
	if name, ok := threads[os.Getpid()]; ok && os.Getpid() != 1 {
		t.Errorf("this test's process %d listed as PID 1's thread %q", os.Getpid(), name)
	}
}

// The witness sees both ends of a real connection open, each in the task
// the kernel ran it in, and names none of them hidden: no thread of PID 1
// made this connection.
func TestWitnessSeesBothOpens(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	const port = 7011
	ln := b.Listen(t, "tcp4", fmt.Sprintf("%s:%d", b.IPv4, port))
	w := watchOpens(t, b.IPv4, port)
	c, err := a.Dial("tcp4", fmt.Sprintf("%s:%d", b.IPv4, port))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	_ = s.Close()
	var opens []witnessedOpen
	Eventually(t, 5*time.Second, "the witness shows both opens", func() error {
		opens = w.opens(t)
		if len(opens) != 2 || opens[0].client == opens[1].client {
			return fmt.Errorf("opens %+v; want one client and one server end", opens)
		}
		return nil
	})
	if c, s := w.HiddenOpens(t); c != 0 || s != 0 {
		t.Errorf("HiddenOpens = %d, %d; want 0, 0: %+v", c, s, opens)
	}
}

package tracertest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
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
 a name with spaces-4242 [001] ..s1. 1.000000: inet_sock_set_state: family=AF_INET protocol=IPPROTO_TCP sport=7003 dport=1 saddr=0.0.0.0 daddr=0.0.0.0 oldstate=TCP_SYN_RECV newstate=TCP_ESTABLISHED
`
	got, err := parseOpens(bufio.NewScanner(strings.NewReader(trace)), 7003)
	if err != nil {
		t.Fatal(err)
	}
	want := []witnessedOpen{{tid: 75, client: true}, {tid: 22}, {tid: 4242}}
	if len(got) != len(want) {
		t.Fatalf("got %d opens, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].tid != want[i].tid || got[i].client != want[i].client {
			t.Errorf("open %d: tid %d client %v, want tid %d client %v", i, got[i].tid, got[i].client, want[i].tid, want[i].client)
		}
	}
	if c, s := hiddenOf(got, func(tid int) bool { return tid == 75 || tid == 4242 }); c != 1 || s != 1 {
		t.Errorf("hidden opens with threads 75 and 4242 PID 1's: %d client, %d server; want 1 and 1", c, s)
	}
	for _, bad := range []string{
		"curl-12 [000] ..s1. 1.0: inet_sock_set_state: sport=1 dport=2", // neither port
		"curl [000] ..s1. 1.0: inet_sock_set_state: sport=7003 dport=2", // no thread id
	} {
		if _, err := parseOpens(bufio.NewScanner(strings.NewReader(bad)), 7003); err == nil {
			t.Errorf("parseOpens(%q): no error", bad)
		}
	}
}

// The witness sees both ends of a real connection open, each in the task
// the kernel ran it in, and names none of them hidden: no thread of PID 1
// made this connection.
func TestInitWitnessSeesBothOpens(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	const port = 7011
	ln := b.Listen(t, "tcp4", fmt.Sprintf("%s:%d", b.IPv4, port))
	w := WatchInit(t, port)
	if w == nil {
		t.Fatal("no witness: tracefs has no instances on this machine")
	}
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
		f, err := os.Open(filepath.Join(w.dir, "trace"))
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }() // read only
		opens, err = parseOpens(bufio.NewScanner(f), port)
		if err != nil {
			return err
		}
		if len(opens) != 2 || opens[0].client == opens[1].client {
			return fmt.Errorf("opens %+v; want one client and one server end", opens)
		}
		return nil
	})
	for _, o := range opens {
		if initThread(o.tid) {
			t.Errorf("open in thread %d counted as PID 1's: %s", o.tid, o.line)
		}
	}
	if c, s := w.HiddenOpens(t); c != 0 || s != 0 {
		t.Errorf("HiddenOpens = %d, %d; want 0, 0", c, s)
	}
}

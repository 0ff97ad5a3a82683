package tracertest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// The sandbox kernel this project's CI runs on (a Firecracker guest, its
// release ends in -fc-...) skips every BPF tracing program not loaded by
// its init while the current task is a thread of PID 1 (its
// bpf_trace_runN tests current->tgid == 1 and bpf_prog_aux.init_owned,
// and returns without running the program or counting a recursion miss;
// see docs/testing.md). A TCP state change the kernel processes in
// softirq while PID 1's thread is the interrupted task is then seen by no
// BPF program at all, deptrace's included: the connection of a SYN
// retransmitted from a timer opens there now and then. The kernel's own
// trace event still fires, with the current task, so an InitWitness,
// which enables that event in a tracefs instance of its own, tells a test
// exactly which of its connections' opens the kernel hid. Mainline
// kernels have no such rule; there the witness finds the opens it lists
// counted anyway, and a test's count may only be exact.

// InitWitness records the opens (state changes to ESTABLISHED) of TCP
// connections to or from one port, with the task the kernel ran them in.
type InitWitness struct {
	dir  string
	port uint16
}

// tracefsInstances is where tracefs keeps its instances.
const tracefsInstances = "/sys/kernel/tracing/instances"

var witnessSeq atomic.Int64

// WatchInit starts an InitWitness for port, removed when the test ends.
// Where tracefs has no instances (not mounted, an old kernel), it logs
// why and returns nil: the test then expects every open counted.
func WatchInit(t testing.TB, port uint16) *InitWitness {
	t.Helper()
	if _, err := os.Stat(tracefsInstances); err != nil {
		t.Logf("no tracefs instances (%v): opens the kernel hides from BPF programs cannot be told apart", err)
		return nil
	}
	dir := filepath.Join(tracefsInstances, fmt.Sprintf("deptrace-test-%d-%d", os.Getpid(), witnessSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("tracefs instance: %v", err)
	}
	w := &InitWitness{dir: dir, port: port}
	t.Cleanup(func() {
		_ = os.WriteFile(w.event("enable"), []byte("0"), 0o644)
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove tracefs instance: %v", err)
		}
	})
	filter := fmt.Sprintf("newstate == %d && (sport == %d || dport == %d)", tcpEstablished, port, port)
	if err := os.WriteFile(w.event("filter"), []byte(filter), 0o644); err != nil {
		t.Fatalf("tracefs filter %q: %v", filter, err)
	}
	if err := os.WriteFile(w.event("enable"), []byte("1"), 0o644); err != nil {
		t.Fatalf("enable sock:inet_sock_set_state: %v", err)
	}
	return w
}

// tcpEstablished is TCP_ESTABLISHED, the event's newstate.
const tcpEstablished = 1

func (w *InitWitness) event(file string) string {
	return filepath.Join(w.dir, "events", "sock", "inet_sock_set_state", file)
}

// HiddenOpens counts the opens the witness saw in a thread of PID 1:
// client ends (the port is the remote one) and server ends. A nil
// witness saw nothing.
func (w *InitWitness) HiddenOpens(t testing.TB) (client, server int) {
	t.Helper()
	if w == nil {
		return 0, 0
	}
	f, err := os.Open(filepath.Join(w.dir, "trace"))
	if err != nil {
		t.Fatalf("read the witness: %v", err)
	}
	defer func() { _ = f.Close() }() // read only
	opens, err := parseOpens(bufio.NewScanner(f), w.port)
	if err != nil {
		t.Fatalf("read the witness: %v", err)
	}
	for _, o := range opens {
		if initThread(o.tid) {
			t.Logf("the kernel opened a connection in thread %d of PID 1, hidden from BPF programs on this kernel: %s", o.tid, o.line)
		}
	}
	return hiddenOf(opens, initThread)
}

// hiddenOf counts the client and server opens made in a thread isInit
// says is PID 1's.
func hiddenOf(opens []witnessedOpen, isInit func(tid int) bool) (client, server int) {
	for _, o := range opens {
		switch {
		case !isInit(o.tid):
		case o.client:
			client++
		default:
			server++
		}
	}
	return client, server
}

// witnessedOpen is one line of the witness's trace.
type witnessedOpen struct {
	tid    int
	client bool // the connection's remote port is the watched one
	line   string
}

// parseOpens reads a tracefs trace of inet_sock_set_state: lines such as
//
//	curl-1234 [001] ..s1. 25209.755253: inet_sock_set_state: family=AF_INET protocol=IPPROTO_TCP sport=55958 dport=7003 ...
//
// where the task's name may hold '-' and spaces (the thread id follows
// the last '-' before the CPU, padded with spaces).
func parseOpens(s *bufio.Scanner, port uint16) ([]witnessedOpen, error) {
	var out []witnessedOpen
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "#") || !strings.Contains(line, "inet_sock_set_state:") {
			continue
		}
		cpu := strings.Index(line, " [")
		dash := strings.LastIndex(line[:max(cpu, 0)], "-")
		if cpu < 0 || dash < 0 {
			return nil, fmt.Errorf("unexpected trace line %q", line)
		}
		tid, err := strconv.Atoi(strings.TrimSpace(line[dash+1 : cpu]))
		if err != nil {
			return nil, fmt.Errorf("thread id in %q: %w", line, err)
		}
		sport, dport := field(line, "sport="), field(line, "dport=")
		switch strconv.Itoa(int(port)) {
		case dport:
			out = append(out, witnessedOpen{tid: tid, client: true, line: line})
		case sport:
			out = append(out, witnessedOpen{tid: tid, line: line})
		default:
			return nil, fmt.Errorf("trace line %q: neither port is %d", line, port)
		}
	}
	return out, s.Err()
}

// field is the value of name (such as "sport=") in a trace line.
func field(line, name string) string {
	i := strings.Index(line, " "+name)
	if i < 0 {
		return ""
	}
	v := line[i+1+len(name):]
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}

// initThread reports whether tid is a thread of PID 1 (global ids: the
// kernel's rule tests the global tgid). Tid 0 is the idle task.
func initThread(tid int) bool {
	if tid <= 0 {
		return false
	}
	_, err := os.Stat(fmt.Sprintf("/proc/1/task/%d", tid))
	return err == nil
}

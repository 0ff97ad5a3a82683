package tracertest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The kernel of the machine CI runs on (a Firecracker guest: its release
// holds "-fc-") runs no BPF tracing program while the current task is a
// thread of PID 1 unless the program's bpf_prog_aux.init_owned is set:
// its bpf_trace_run3 tests current->tgid == 1 and that flag, and returns
// without running the program or counting a recursion miss (see
// docs/testing.md). A TCP state change the kernel makes in softirq while
// a thread of PID 1 is the interrupted task is then seen by no BPF
// program, deptrace's included: the connection of a SYN retransmitted
// from a timer opens there now and then. The kernel's own trace event
// still fires, with the current task, so an OpenWitness, which enables
// that event in a tracefs instance of its own, tells a test exactly which
// of its connections' opens the kernel hid. On other kernels WatchOpens
// returns nil and the test's counts must be exact.

// OpenWitness records the opens (state changes to ESTABLISHED) of the TCP
// connections to one server address, with the task the kernel ran each
// in.
type OpenWitness struct {
	dir  string
	ip   string
	port uint16
	init map[int]string // PID 1's threads and their names when the witness started
}

// tracefsInstances is where tracefs keeps its instances.
const tracefsInstances = "/sys/kernel/tracing/instances"

// witnessPrefix starts the name of every instance a witness makes; the
// rest is the test process's pid and a sequence number.
const witnessPrefix = "deptrace-test-"

var witnessSeq int

// HidesInit reports whether this kernel is one that hides PID 1's threads
// from BPF programs: the CI machine's (its release holds "-fc-").
func HidesInit(release string) bool { return strings.Contains(release, "-fc-") }

// WatchOpens starts an OpenWitness of the connections to ip:port, removed
// when the test ends. On a kernel that hides nothing from BPF programs it
// returns nil: every open must be counted.
func WatchOpens(t testing.TB, ip net.IP, port uint16) *OpenWitness {
	t.Helper()
	release, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatalf("kernel release: %v", err)
	}
	if !HidesInit(string(release)) {
		return nil
	}
	return watchOpens(t, ip, port)
}

// watchOpens is WatchOpens on any kernel.
func watchOpens(t testing.TB, ip net.IP, port uint16) *OpenWitness {
	t.Helper()
	if _, err := os.Stat(tracefsInstances); err != nil {
		t.Fatalf("this kernel hides PID 1's threads from BPF programs, and the witness of what it hides needs tracefs instances: %v", err)
	}
	removeStaleWitnesses(t)
	witnessSeq++
	dir := filepath.Join(tracefsInstances, fmt.Sprintf("%s%d-%d", witnessPrefix, os.Getpid(), witnessSeq))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create tracefs instance: %v", err)
	}
	w := &OpenWitness{dir: dir, ip: ip.String(), port: port, init: initThreads(t)}
	t.Cleanup(func() {
		_ = os.WriteFile(w.event("enable"), []byte("0"), 0o644) // rmdir removes it anyway
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove tracefs instance: %v", err)
		}
	})
	// In this order: the filter before the event is on.
	for _, set := range []struct{ file, value string }{
		{filepath.Join(dir, "buffer_size_kb"), "64"}, // a few lines per test
		{w.event("filter"), fmt.Sprintf("newstate == %d && (sport == %d || dport == %d)", tcpEstablished, port, port)},
		{w.event("enable"), "1"},
	} {
		if err := os.WriteFile(set.file, []byte(set.value), 0o644); err != nil {
			t.Fatalf("set %s to %q: %v", set.file, set.value, err)
		}
	}
	return w
}

// tcpEstablished is TCP_ESTABLISHED, the event's newstate.
const tcpEstablished = 1

func (w *OpenWitness) event(file string) string {
	return filepath.Join(w.dir, "events", "sock", "inet_sock_set_state", file)
}

// removeStaleWitnesses removes the instances of test processes that died
// without their cleanup (each keeps per-CPU buffers).
func removeStaleWitnesses(t testing.TB) {
	t.Helper()
	entries, _ := os.ReadDir(tracefsInstances)
	for _, e := range entries {
		pid, _, ok := strings.Cut(strings.TrimPrefix(e.Name(), witnessPrefix), "-")
		if !strings.HasPrefix(e.Name(), witnessPrefix) || !ok {
			continue
		}
		if _, err := os.Stat("/proc/" + pid); err == nil {
			continue // its test still runs
		}
		if err := os.Remove(filepath.Join(tracefsInstances, e.Name())); err != nil {
			t.Logf("remove a dead test's tracefs instance %s: %v", e.Name(), err)
		}
	}
}

// HiddenOpens counts the opens the witness saw in a thread of PID 1 (one
// that already ran, with the same name, when the witness started): client
// ends (ip:port is the remote end) and server ends. A nil witness saw
// nothing.
func (w *OpenWitness) HiddenOpens(t testing.TB) (client, server int) {
	t.Helper()
	if w == nil {
		return 0, 0
	}
	opens := w.opens(t)
	isInit := func(o witnessedOpen) bool { name, ok := w.init[o.tid]; return ok && name == o.task }
	for _, o := range opens {
		if isInit(o) {
			t.Logf("the kernel opened a connection in thread %d of PID 1, hidden from BPF programs on this kernel: %s", o.tid, o.line)
		}
	}
	return hiddenOf(opens, isInit)
}

// opens reads the witness's trace.
func (w *OpenWitness) opens(t testing.TB) []witnessedOpen {
	t.Helper()
	f, err := os.Open(filepath.Join(w.dir, "trace"))
	if err != nil {
		t.Fatalf("open the witness's trace: %v", err)
	}
	defer func() { _ = f.Close() }() // read only
	opens, err := parseOpens(bufio.NewScanner(f), w.ip, w.port)
	if err != nil {
		t.Fatalf("parse the witness's trace: %v", err)
	}
	return opens
}

// hiddenOf counts the client and server opens isInit says were made in a
// thread of PID 1.
func hiddenOf(opens []witnessedOpen, isInit func(witnessedOpen) bool) (client, server int) {
	for _, o := range opens {
		if !isInit(o) {
			continue
		}
		if o.client {
			client++
		} else {
			server++
		}
	}
	return client, server
}

// witnessedOpen is one line of the witness's trace.
type witnessedOpen struct {
	task   string
	tid    int
	client bool // the connection's remote end is the watched one
	line   string
}

// traceLine is the start of a tracefs line: the task's name (which may
// hold '-' and spaces), its thread id, the tgid where the record-tgid
// option is on, and the CPU.
var traceLine = regexp.MustCompile(`^\s*(.+)-(\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[\d+\]`)

// parseOpens reads a tracefs trace of inet_sock_set_state, such as
//
//	curl-1234 [001] ..s1. 25209.755253: inet_sock_set_state: family=AF_INET protocol=IPPROTO_TCP sport=55958 dport=7003 saddr=198.51.100.1 daddr=198.51.100.2 ...
//
// and returns the opens of connections to ip:port (the server end's too).
// Lost events are an error: the witness would miss what it is for.
func parseOpens(s *bufio.Scanner, ip string, port uint16) ([]witnessedOpen, error) {
	var out []witnessedOpen
	p := strconv.Itoa(int(port))
	for s.Scan() {
		line := s.Text()
		if strings.Contains(line, "LOST") && strings.Contains(line, "EVENTS") {
			return nil, fmt.Errorf("the trace lost events: %q", line)
		}
		if strings.HasPrefix(line, "#") || !strings.Contains(line, "inet_sock_set_state:") {
			continue
		}
		m := traceLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("unexpected trace line %q", line)
		}
		tid, err := strconv.Atoi(m[2])
		if err != nil {
			return nil, fmt.Errorf("thread id in %q: %w", line, err)
		}
		o := witnessedOpen{task: strings.TrimSpace(m[1]), tid: tid, line: line}
		switch {
		case field(line, "dport=") == p && field(line, "daddr=") == ip:
			o.client = true
		case field(line, "sport=") == p && field(line, "saddr=") == ip:
		default:
			continue // another server on the same port
		}
		out = append(out, o)
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

// initThreads lists PID 1's threads with their names (global ids: the
// kernel's rule tests the global tgid, and the tests run in the initial
// pid namespace).
func initThreads(t testing.TB) map[int]string {
	t.Helper()
	entries, err := os.ReadDir("/proc/1/task")
	if err != nil {
		t.Fatalf("list PID 1's threads: %v", err)
	}
	threads := map[int]string{}
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc/1/task", e.Name(), "comm"))
		if err != nil {
			continue // exited meanwhile
		}
		threads[tid] = strings.TrimSpace(string(comm))
	}
	return threads
}

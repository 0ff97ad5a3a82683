// Package hostile runs a real `deptrace agent` against loads that make
// many distinct flows (a port scan, a UDP server hearing from tens of
// thousands of peers, 100,000 flows in one interval) inside network
// namespaces the tests create, and checks that what it keeps stays
// bounded: its memory under the ceiling docs/performance.md gives, the
// edges per local end in the store and the metrics under
// --max-edges-per-node with what was folded counted, and every loss
// counted in the log and the metrics.
package hostile

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	agentpkg "github.com/deptrace/deptrace/internal/agent"
	"github.com/deptrace/deptrace/internal/bundler"
	"github.com/deptrace/deptrace/internal/metrics"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

var deptrace string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deptrace-hostile")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	deptrace = filepath.Join(dir, "deptrace")
	if out, err := exec.Command("go", "build", "-o", deptrace, "../../cmd/deptrace").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build deptrace: %v\n%s", err, out)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// comm is the command name of this test binary, which makes the load:
// the local end whose edges are capped.
var comm = func() string {
	b, _ := os.ReadFile("/proc/self/comm")
	return strings.TrimSpace(string(b))
}()

// agent is a running `deptrace agent` with its log collected.
type agent struct {
	cmd     *exec.Cmd
	db      string
	mu      sync.Mutex
	lines   []string
	metrics string // URL of /metrics
	ready   chan struct{}
	drained chan struct{} // one value per drain, dropped when nobody waits
	done    chan error
}

// startAgent runs the agent on the namespace ns only (other work on the
// machine stays out of its counts), with its store in a temporary
// directory.
func startAgent(t *testing.T, ns string, args ...string) *agent {
	t.Helper()
	dir := t.TempDir()
	a := &agent{db: filepath.Join(dir, "deptrace.db"), ready: make(chan struct{}), drained: make(chan struct{}), done: make(chan error, 1)}
	full := append([]string{"agent", "--store", a.db, "--spool", filepath.Join(dir, "spool.jsonl"), "--pin-path", "",
		"--netns", ns, "--no-identity", "--metrics-listen", "127.0.0.1:0", "--log-level", "debug", "--host-id", "hostile"}, args...)
	a.cmd = exec.Command(deptrace, full...)
	a.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { // the agent's own Go runtime targets
		return strings.HasPrefix(kv, "GOGC=") || strings.HasPrefix(kv, "GOMEMLIMIT=") || strings.HasPrefix(kv, "GOMAXPROCS=")
	})
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := a.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("deptrace %s", strings.Join(full, " "))
	url := regexp.MustCompile(`msg="metrics served".* url=(\S+)`)
	go func() {
		s := bufio.NewScanner(stderr)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		started := false
		for s.Scan() {
			line := s.Text()
			a.mu.Lock()
			a.lines = append(a.lines, line)
			if m := url.FindStringSubmatch(line); m != nil {
				a.metrics = m[1]
			}
			a.mu.Unlock()
			switch {
			case !started && strings.Contains(line, `msg="agent started"`):
				started = true
				close(a.ready)
			case strings.Contains(line, `msg="interval drained"`):
				select {
				case a.drained <- struct{}{}:
				default:
				}
			}
		}
		a.done <- a.cmd.Wait()
	}()
	t.Cleanup(func() {
		if a.cmd.ProcessState == nil {
			_ = a.cmd.Process.Kill() // a failed test's agent, killed on purpose
			if err := <-a.done; err != nil {
				t.Logf("agent killed: %v", err)
			}
		}
	})
	select {
	case <-a.ready:
	case err := <-a.done:
		t.Fatalf("agent exited before starting: %v\n%s", err, a.log())
	case <-time.After(90 * time.Second):
		t.Fatalf("agent not started after 90 s\n%s", a.log())
	}
	return a
}

func (a *agent) log() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.lines, "\n")
}

// waitDrains waits for n more drains.
func (a *agent) waitDrains(t *testing.T, n int, interval time.Duration) {
	t.Helper()
	for range n {
		select {
		case <-a.drained:
		case <-time.After(interval + 60*time.Second):
			t.Fatalf("no drain within %s\n%s", interval+60*time.Second, a.log())
		}
	}
}

// idle logs the agent's memory before the load.
func (a *agent) idle(t *testing.T) {
	t.Helper()
	peak, now := a.memory(t)
	t.Logf("agent memory before the load: peak RSS %.1f MiB, RSS %.1f MiB", mib(peak), mib(now))
}

// memory is the agent's peak and current resident set (VmHWM, VmRSS).
func (a *agent) memory(t *testing.T) (peak, now int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && (f[0] == "VmHWM:" || f[0] == "VmRSS:") {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			if f[0] == "VmHWM:" {
				peak = kb << 10
			} else {
				now = kb << 10
			}
		}
	}
	return peak, now
}

// bpfMaps is the kernel memory of the BPF maps the agent holds open
// (memlock in their fdinfo: on Linux 6.4+ the memory in use), each map
// once.
func (a *agent) bpfMaps(t *testing.T) (bytes int64, maps int) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", a.cmd.Process.Pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		var id string
		var memlock int64
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			switch k {
			case "map_id":
				id = strings.TrimSpace(v)
			case "memlock":
				memlock, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		if id != "" && !seen[id] {
			seen[id] = true
			bytes += memlock
		}
	}
	return bytes, len(seen)
}

// stop sends SIGTERM (the agent stores its last partial interval) and
// waits for it to exit.
func (a *agent) stop(t *testing.T) {
	t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a.done:
		if err != nil {
			t.Fatalf("agent: %v\n%s", err, a.log())
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("agent did not stop within 90 s\n%s", a.log())
	}
}

// scrape reads every sample of the agent's /metrics as
// `name{label="value",...}` -> value.
func (a *agent) scrape(t *testing.T) (map[string]float64, int) {
	t.Helper()
	a.mu.Lock()
	url := a.metrics
	a.mu.Unlock()
	client := http.Client{Timeout: 60 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			}
		}
	}
	return out, len(body)
}

// sumLogged sums the value of key=N over the log lines holding msg.
func (a *agent) sumLogged(msg, key string) uint64 {
	re := regexp.MustCompile(`\b` + key + `=(\d+)`)
	var n uint64
	for _, l := range strings.Split(a.log(), "\n") {
		if !strings.Contains(l, `msg="`+msg) {
			continue
		}
		if m := re.FindStringSubmatch(l); m != nil {
			v, _ := strconv.ParseUint(m[1], 10, 64)
			n += v
		}
	}
	return n
}

// stored is what the store holds of this test binary's flows.
type stored struct {
	edges   map[string]bool // distinct edges: direction, proto, local, remote, port
	other   tracer.Counters // the edges to _other
	total   tracer.Counters
	obsRows int
	bytes   int64 // the SQLite file and its WAL
}

func readStore(t *testing.T, db string) stored {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := store.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	obs, err := st.Observations(ctx, store.Range{})
	if err != nil {
		t.Fatal(err)
	}
	s := stored{edges: map[string]bool{}}
	for _, o := range obs {
		if o.Comm != comm {
			continue
		}
		s.obsRows++
		s.edges[fmt.Sprintf("%s %s %s %s %d", o.Direction, o.Proto, o.LocalAddr, o.RemoteAddr, o.Port)] = true
		s.total.Add(o.Counters)
		if o.RemoteAddr == "_other" {
			s.other.Add(o.Counters)
		}
	}
	var size int64
	for _, suffix := range []string{"", "-wal"} {
		if fi, err := os.Stat(db + suffix); err == nil {
			size += fi.Size()
		}
	}
	s.bytes = size
	return s
}

// report logs the agent's memory and the size of its metrics, and checks
// the memory against the ceiling docs/performance.md gives.
func report(t *testing.T, a *agent, flowMapSize int, series int) {
	t.Helper()
	peak, now := a.memory(t)
	ceiling := memoryCeiling(flowMapSize, series)
	t.Logf("agent memory: peak RSS (VmHWM) %.1f MiB, RSS now %.1f MiB; ceiling for --flow-map-size %d and %d metric series: %.1f MiB",
		mib(peak), mib(now), flowMapSize, series, mib(ceiling))
	kb, n := a.bpfMaps(t)
	t.Logf("kernel side: %d BPF maps the agent holds take %.1f MiB (memlock)", n, mib(kb))
	if peak > ceiling {
		t.Errorf("the agent's peak RSS %.1f MiB is above the documented ceiling %.1f MiB (docs/performance.md, \"Memory under hostile cardinality\")", mib(peak), mib(ceiling))
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// memoryCeiling is docs/performance.md's formula for the agent's peak
// resident memory (agent.MemoryCeiling) on this machine's CPUs.
func memoryCeiling(flowMapSize, series int) int64 {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		panic(err)
	}
	return agentpkg.MemoryCeiling(uint32(flowMapSize), ncpu, series)
}

// checkGoRuntime checks the Go runtime targets the agent set at its
// defaults (internal/agent/memory.go), as its metrics show them: one
// thread, GOGC 200, and the soft limit without pinning (--pin-path "")
// and fewer edges than move it.
func checkGoRuntime(t *testing.T, m map[string]float64) {
	t.Helper()
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	wantLimit := agentpkg.SoftMemoryLimit(65536, ncpu, metrics.DefaultMaxSeries, agentpkg.DefaultBufferMax, false)
	procs, gogc, limit := m["go_sched_gomaxprocs_threads{}"], m["go_gc_gogc_percent{}"], m["go_gc_gomemlimit_bytes{}"]
	if procs != agentpkg.DefaultMaxProcs || gogc != agentpkg.GCPercent || int64(limit) != wantLimit {
		t.Errorf("agent's Go runtime: GOMAXPROCS %v, GOGC %v, memory limit %v; want %d, %d and %d",
			procs, gogc, limit, agentpkg.DefaultMaxProcs, agentpkg.GCPercent, wantLimit)
	}
}

// checkLosses checks that what the kernel side lost is the same in the
// log and the metrics, and returns it (every cause).
func checkLosses(t *testing.T, a *agent, m map[string]float64) uint64 {
	t.Helper()
	logged := a.sumLogged("events lost this interval", "total")
	var metric float64
	var causes []string
	for k, v := range m {
		if strings.HasPrefix(k, "deptrace_events_lost_total{") {
			metric += v
			if v > 0 {
				causes = append(causes, fmt.Sprintf("%s %v", strings.TrimPrefix(k, "deptrace_events_lost_total"), v))
				reason := strings.TrimSuffix(strings.TrimPrefix(k, `deptrace_events_lost_total{reason="`), `"}`)
				if !strings.Contains(a.log(), " "+reason+"=") {
					t.Errorf("the agent's log never names the loss cause %s", reason)
				}
			}
		}
	}
	sort.Strings(causes)
	if float64(logged) != metric {
		t.Errorf("events lost: %d in the log, %v in the metrics", logged, metric)
	}
	if logged > 0 {
		t.Logf("events lost: %d: %s", logged, strings.Join(causes, ", "))
	}
	return logged
}

// checkFolded returns the flows folded (the metric) and checks that the
// log says which local end reached the cap and how many flows were
// folded (once a minute at most, so up to the last minute's).
func checkFolded(t *testing.T, a *agent, m map[string]float64) uint64 {
	t.Helper()
	folded := uint64(m["deptrace_edges_folded_flows_total{}"])
	logged := a.sumLogged("flows folded into _other edges", "flows")
	if logged == 0 || logged > folded {
		t.Errorf("folded flows: %d in the log, %d in the metrics; want some in the log, at most the metric", logged, folded)
	}
	if !strings.Contains(a.log(), `msg="local end reached --max-edges-per-node`) || !strings.Contains(a.log(), "process="+comm) {
		t.Errorf("the log does not say that %s reached the cap", comm)
	}
	return folded
}

// TestPortScan: 20,000 connects to closed ports of one host. The scanner
// keeps --max-edges-per-node edges (here 500) in the store and the
// metrics; the rest is one edge to _other; every refused connect is
// counted exactly once.
func TestPortScan(t *testing.T) {
	const ports, capEdges = 20000, 500
	nw := testnet.New(t, 2)
	scanner, target := nw.Hosts[0], nw.Hosts[1]
	a := startAgent(t, scanner.Name, "--interval", "5s", "--max-edges-per-node", strconv.Itoa(capEdges))
	a.waitDrains(t, 1, 5*time.Second)
	a.idle(t)

	refused := 0
	start := time.Now()
	scanner.Do(t, func() error {
		dst := &syscall.SockaddrInet4{}
		copy(dst.Addr[:], target.IPv4.To4())
		for port := 1; port <= ports; port++ {
			fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			dst.Port = port
			err = syscall.Connect(fd, dst)
			syscall.Close(fd)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				return fmt.Errorf("connect to port %d: %v, want connection refused", port, err)
			}
			refused++
		}
		return nil
	})
	t.Logf("scan: %d refused connects in %s", refused, time.Since(start).Round(time.Millisecond))
	a.waitDrains(t, 2, 5*time.Second)
	m, size := a.scrape(t)
	report(t, a, 65536, int(m["deptrace_metrics_series{}"]))
	a.stop(t)
	checkGoRuntime(t, m)

	lost := checkLosses(t, a, m)
	folded := checkFolded(t, a, m)
	s := readStore(t, a.db)
	t.Logf("store: %d distinct edges of %s, %d rows, %.1f MiB; folded %d flows; lost %d; metrics: %v series, %d bytes a scrape",
		len(s.edges), comm, s.obsRows, mib(s.bytes), folded, lost, m["deptrace_metrics_series{}"], size)
	// Every refused connect is stored or counted lost.
	if s.total.FailedRefused+lost != ports || s.total.FailedConnections != s.total.FailedRefused || s.total.Connections != 0 {
		t.Errorf("store: %d refused (+ %d lost) of %d failed, %d connections; want %d refused and lost, 0 connections", s.total.FailedRefused, lost, s.total.FailedConnections, s.total.Connections, ports)
	}
	if len(s.edges) != capEdges+1 || !s.edges["outbound tcp  _other 0"] {
		t.Errorf("store: %d edges; want %d and one to _other", len(s.edges), capEdges+1)
	}
	if s.other.FailedRefused != folded || folded != s.total.FailedRefused-capEdges {
		t.Errorf("_other holds %d refused, %d flows folded; want %d", s.other.FailedRefused, folded, s.total.FailedRefused-capEdges)
	}
	// The metrics: one outbound series per edge held, and _other.
	var series, refusedMetric float64
	for k, v := range m {
		if strings.HasPrefix(k, "deptrace_outbound_failed_connections_total{") && strings.Contains(k, `process="`+comm+`"`) {
			series++
			refusedMetric += v
		}
	}
	if series != capEdges+1 || refusedMetric != float64(s.total.FailedConnections) {
		t.Errorf("metrics: %v outbound series of %s with %v failed connections; want %d and %d", series, comm, refusedMetric, capEdges+1, s.total.FailedConnections)
	}

	// look shows the folded edge.
	out, err := exec.Command(deptrace, "look", comm, "--store", a.db).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-> tcp _other (external)") {
		t.Errorf("look %s: %v\n%s", comm, err, out)
	}
}

// TestFiftyThousandUDPPeers: a UDP server (bound to port 5353) hears
// from 50,000 distinct peers in a minute, one datagram each, from
// addresses of 2001:db8::/64 that the client binds with IPV6_FREEBIND.
// The server's node keeps --max-edges-per-node (default 1000) inbound
// edges; the rest are one edge to _other on port 5353, every datagram
// counted once.
func TestFiftyThousandUDPPeers(t *testing.T) {
	const peers, perSecond, capEdges = 50000, 1000, 1000
	nw := testnet.New(t, 2)
	client, server := nw.Hosts[0], nw.Hosts[1]
	a := startAgent(t, server.Name, "--interval", "5s")
	pc := server.ListenPacket(t, "udp6", fmt.Sprintf("[%s]:5353", server.IPv6))
	// A deep receive queue (root may exceed rmem_max): on a busy machine
	// the reader may lag, and a datagram the socket dropped would not
	// be the peer the load claims.
	raw, err := pc.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 64<<20)
	}); err != nil || serr != nil {
		t.Fatalf("SO_RCVBUFFORCE: %v %v", err, serr)
	}
	got := make(chan int, 1)
	go func() {
		buf := make([]byte, 64)
		n := 0
		for n < peers {
			_ = pc.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, _, err := pc.ReadFrom(buf); err != nil {
				break
			}
			n++
		}
		got <- n
	}()
	a.waitDrains(t, 1, 5*time.Second)
	a.idle(t)

	start := time.Now()
	client.Do(t, func() error {
		dst := &syscall.SockaddrInet6{Port: 5353}
		copy(dst.Addr[:], server.IPv6.To16())
		for i := range peers {
			fd, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			src := &syscall.SockaddrInet6{}
			copy(src.Addr[:], client.IPv6.To16()) // 2001:db8::/64
			binary.BigEndian.PutUint64(src.Addr[8:], 1<<32|uint64(i))
			err = syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, 78 /* IPV6_FREEBIND */, 1)
			if err == nil {
				err = syscall.Bind(fd, src)
			}
			if err == nil {
				err = syscall.Sendto(fd, []byte("peer"), 0, dst)
			}
			syscall.Close(fd)
			if err != nil {
				return fmt.Errorf("peer %d: %w", i, err)
			}
			if (i+1)%perSecond == 0 { // at most perSecond a second
				if d := time.Duration(i+1) * time.Second / perSecond; time.Since(start) < d {
					time.Sleep(d - time.Since(start))
				}
			}
		}
		return nil
	})
	received := <-got
	t.Logf("%d peers sent in %s, %d datagrams received", peers, time.Since(start).Round(time.Millisecond), received)
	if received != peers {
		t.Fatalf("the server received %d of %d datagrams", received, peers)
	}
	a.waitDrains(t, 2, 5*time.Second)
	m, size := a.scrape(t)
	report(t, a, 65536, int(m["deptrace_metrics_series{}"]))
	a.stop(t)
	checkGoRuntime(t, m)

	lost := checkLosses(t, a, m)
	folded := checkFolded(t, a, m)
	s := readStore(t, a.db)
	t.Logf("store: %d distinct edges of %s, %d rows, %.1f MiB; folded %d flows; lost %d; metrics: %v series, %d bytes a scrape",
		len(s.edges), comm, s.obsRows, mib(s.bytes), folded, lost, m["deptrace_metrics_series{}"], size)
	// One datagram per peer: each is stored or counted lost.
	if s.total.DatagramsReceived+lost != peers {
		t.Errorf("store: %d datagrams received + %d lost; want %d", s.total.DatagramsReceived, lost, peers)
	}
	if len(s.edges) != capEdges+1 || !s.edges[fmt.Sprintf("inbound udp %s _other 5353", server.IPv6)] {
		t.Errorf("store: %d edges; want %d and one from _other to port 5353", len(s.edges), capEdges+1)
	}
	if s.other.DatagramsReceived != folded || folded != s.total.DatagramsReceived-capEdges {
		t.Errorf("_other holds %d datagrams, %d flows folded; want %d", s.other.DatagramsReceived, folded, s.total.DatagramsReceived-capEdges)
	}
}

// TestHundredThousandFlowsInOneInterval: 100,000 datagrams to distinct
// destinations (ports 1 to 50,000 of the target's IPv4 and IPv6
// addresses) sent right after a drain, so that they fall in one 10 s
// interval, with the default 65,536-flow map: what the map and its spill
// cannot hold is lost and counted (log and metrics agree, and stored plus
// lost is every datagram); what is stored is capped per local end.
func TestHundredThousandFlowsInOneInterval(t *testing.T) {
	const flows = 100000
	nw := testnet.New(t, 2)
	client, target := nw.Hosts[0], nw.Hosts[1]
	a := startAgent(t, client.Name, "--interval", "10s")
	a.waitDrains(t, 1, 10*time.Second)
	a.idle(t)
	a.waitDrains(t, 1, 10*time.Second) // the load starts right after a drain

	start := time.Now()
	client.Do(t, func() error {
		fd4, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd4)
		fd6, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(fd6)
		d4 := &syscall.SockaddrInet4{}
		copy(d4.Addr[:], target.IPv4.To4())
		d6 := &syscall.SockaddrInet6{}
		copy(d6.Addr[:], target.IPv6.To16())
		for i := range flows {
			port := 1 + i/2
			if i%2 == 0 {
				d4.Port = port
				err = syscall.Sendto(fd4, []byte("x"), 0, d4)
			} else {
				d6.Port = port
				err = syscall.Sendto(fd6, []byte("x"), 0, d6)
			}
			if err != nil {
				return fmt.Errorf("datagram %d: %w", i, err)
			}
		}
		return nil
	})
	took := time.Since(start)
	t.Logf("%d datagrams to distinct destinations in %s", flows, took.Round(time.Millisecond))
	a.waitDrains(t, 2, 10*time.Second)
	m, size := a.scrape(t)
	report(t, a, 65536, int(m["deptrace_metrics_series{}"]))
	a.stop(t)
	checkGoRuntime(t, m)

	lost := checkLosses(t, a, m)
	folded := checkFolded(t, a, m)
	s := readStore(t, a.db)
	t.Logf("store: %d distinct edges of %s, %d rows, %.1f MiB; folded %d flows; lost %d; metrics: %v series, %d bytes a scrape",
		len(s.edges), comm, s.obsRows, mib(s.bytes), folded, lost, m["deptrace_metrics_series{}"], size)
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	held := uint64(65536 + bundler.SpillSlots(65536) + bundler.FlowCacheSlots*uint32(ncpu))
	if lost < flows-held || s.total.DatagramsSent+lost != flows {
		// The map (65,536), its spill (8,192) and the flow cache (64 per
		// CPU) hold at most this many of the interval's flows.
		t.Errorf("store %d datagrams sent + %d lost = %d; want %d, and at least %d lost (did the load span two intervals? it took %s)",
			s.total.DatagramsSent, lost, s.total.DatagramsSent+lost, flows, flows-held, took)
	}
	if s.other.DatagramsSent != folded || folded != s.total.DatagramsSent-1000 {
		t.Errorf("_other holds %d datagrams, %d flows folded; want %d", s.other.DatagramsSent, folded, s.total.DatagramsSent-1000)
	}
	if len(s.edges) != 1000+1 || !s.edges["outbound udp  _other 0"] {
		t.Errorf("store: %d edges of %s; want 1,000 and one to _other (udp over IPv4 and IPv6 fold into one per direction and protocol)", len(s.edges), comm)
	}

	// The API answers on the folded graph.
	serve := exec.Command(deptrace, "serve", "--listen", "127.0.0.1:0", "--store", a.db)
	serve.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := serve.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = serve.Process.Kill(); _ = serve.Wait() }()
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		re := regexp.MustCompile(`msg=serving.* url=(\S+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
	}()
	var base string
	select {
	case base = <-urls:
	case <-time.After(60 * time.Second):
		t.Fatal("deptrace serve did not start within 60 s")
	}
	client2 := http.Client{Timeout: 60 * time.Second}
	for _, path := range []string{"api/graph", "api/look?target=" + comm} {
		t0 := time.Now()
		resp, err := client2.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("GET /%s: %s, %d bytes in %s", path, resp.Status, len(body), time.Since(t0).Round(time.Millisecond))
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "_other") {
			t.Errorf("GET /%s: %s, _other in the answer: %t", path, resp.Status, strings.Contains(string(body), "_other"))
		}
	}
}

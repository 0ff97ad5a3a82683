package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/agent"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// fleetRoles are the programs of the fleet test: a client, a proxy that
// forwards each request to an app server, which asks a database.
var fleetRoles = map[string]func(args []string) error{
	"dbserver": func(args []string) error {
		return serve(args[0], func(req string) (string, error) { return "row for " + req, nil })
	},
	"app":   func(args []string) error { return serve(args[0], forwardTo(args[1])) },
	"proxy": func(args []string) error { return serve(args[0], forwardTo(args[1])) },
	"client": func(args []string) error {
		n, _ := strconv.Atoi(args[1])
		for i := 0; i < n; i++ {
			if _, err := ask(args[0], fmt.Sprintf("req-%d", i)); err != nil {
				return err
			}
		}
		return nil
	},
}

// serve answers one line per connection, for at most a minute.
func serve(addr string, handle func(string) (string, error)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	time.AfterFunc(time.Minute, func() { ln.Close() })
	fmt.Println("ready")
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			req, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			resp, err := handle(strings.TrimSpace(req))
			if err != nil {
				resp = "error: " + err.Error()
			}
			_, _ = fmt.Fprintln(c, resp) // the fleet's peer: a lost reply fails the client's read
		}()
	}
}

func forwardTo(upstream string) func(string) (string, error) {
	return func(req string) (string, error) { return ask(upstream, req) }
}

func ask(addr, req string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = fmt.Fprintln(c, req) // a failed send fails the read below
	return bufio.NewReader(c).ReadString('\n')
}

// Four hosts, one agent each writing to one PostgreSQL; the graph must hold
// exactly the three dependencies, both processes named on each.
func TestFleetGraph(t *testing.T) {
	testnet.RequireRoot(t)
	dsn := pgtest.Start(t)
	nw := testnet.New(t, 4)
	client, web, app, db := nw.Hosts[0], nw.Hosts[1], nw.Hosts[2], nw.Hosts[3]

	// Role programs: symlinks to this test binary, named after the role.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	roles := t.TempDir()
	if err := os.Chmod(roles, 0o755); err != nil {
		t.Fatal(err)
	}
	for name := range fleetRoles {
		if err := os.Symlink(self, filepath.Join(roles, name)); err != nil {
			t.Fatal(err)
		}
	}

	// One agent per host, each limited to its host's namespace.
	var agents []*proc
	for _, h := range nw.Hosts {
		p := startReady(t, "msg=\"agent started\"", "agent", "--netns", h.Name, "--store", dsn, "--interval", "1s",
			"--host-id", "fleet", "--spool", filepath.Join(t.TempDir(), "spool"), "--metrics-listen", "", "--pin-path", testPinPath(t, h.Name))
		agents = append(agents, p)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	startRole := func(h *testnet.Host, role string, args ...string) {
		cmd := h.Command(ctx, filepath.Join(roles, role), args...)
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		line, _ := bufio.NewReader(out).ReadString('\n')
		if strings.TrimSpace(line) != "ready" {
			t.Fatalf("%s on %s did not start: %q", role, h.Name, line)
		}
	}
	hp := func(h *testnet.Host, port int) string { return net.JoinHostPort(h.IPv4.String(), strconv.Itoa(port)) }
	startRole(db, "dbserver", hp(db, 5432))
	startRole(app, "app", hp(app, 8080), hp(db, 5432))
	startRole(web, "proxy", hp(web, 80), hp(app, 8080))
	const requests = 10
	if out, err := client.Command(ctx, filepath.Join(roles, "client"), hp(web, 80), strconv.Itoa(requests)).CombinedOutput(); err != nil {
		t.Fatalf("client: %v %s", err, out)
	}

	id := func(h *testnet.Host) string { return "fleet/" + h.Name }
	want := []string{
		fmt.Sprintf("app@%s -> dbserver@%s:5432 conns=%d", id(app), id(db), requests),
		fmt.Sprintf("client@%s -> proxy@%s:80 conns=%d", id(client), id(web), requests),
		fmt.Sprintf("proxy@%s -> app@%s:8080 conns=%d", id(web), id(app), requests),
	}
	sort.Strings(want)
	// edges reads the graph from the store, one line per edge.
	edges := func() (got []string, stdout string) {
		stdout, stderr, code := run(t, nil, "graph", "--format", "json", "--group-by", "process", "--store", dsn)
		if code != 0 {
			t.Fatalf("graph: %s", stderr)
		}
		var g graph.Graph
		if err := json.Unmarshal([]byte(stdout), &g); err != nil {
			t.Fatal(err)
		}
		nodes := map[string]graph.Node{}
		for _, n := range g.Nodes {
			nodes[n.ID] = n
		}
		for _, e := range g.Edges {
			from, to := nodes[e.From], nodes[e.To]
			got = append(got, fmt.Sprintf("%s@%s -> %s@%s:%d conns=%d", from.Process, from.Host, to.Process, to.Host, e.Port, e.Connections))
		}
		sort.Strings(got)
		return got, stdout
	}
	// The agents store every interval: wait until the store holds the
	// three dependencies (both ends of each), then stop them, which adds
	// nothing more.
	eventually(t, 30*time.Second, "the agents store the three dependencies", func() error {
		if got, _ := edges(); !slices.Equal(got, want) {
			return fmt.Errorf("the store holds:\n%s", strings.Join(got, "\n"))
		}
		return nil
	})
	for _, p := range agents {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range agents {
		p.wait(t)
		if strings.Contains(p.errText(), "level=WARN") || strings.Contains(p.errText(), "level=ERROR") {
			t.Errorf("agent warned:\n%s", p.errText())
		}
	}

	got, stdout := edges()
	t.Logf("graph edges:\n%s", strings.Join(got, "\n"))
	if !slices.Equal(got, want) {
		t.Errorf("graph edges:\n%s\nwant exactly:\n%s\nfull graph:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), stdout)
	}

	// look answers the operator's question on the same store.
	stdout, stderr, code := run(t, nil, "look", hp(db, 5432), "--reverse", "--group-by", "process", "--store", dsn)
	if code != 0 {
		t.Fatalf("look: %s", stderr)
	}
	for _, w := range []string{"<- app on " + id(app), "<- proxy on " + id(web), "<- client on " + id(client)} {
		if !strings.Contains(stdout, w) {
			t.Errorf("look --reverse lacks %q:\n%s", w, stdout)
		}
	}
}

// startReady starts deptrace and waits for a stderr line containing ready.
func startReady(t *testing.T, ready string, args ...string) *proc {
	t.Helper()
	return startReadyEnv(t, nil, ready, args...)
}

// startReadyEnv is startReady with env added to the environment.
func startReadyEnv(t *testing.T, env []string, ready string, args ...string) *proc {
	t.Helper()
	return startReadyVia(t, nil, env, ready, args...)
}

// startReadyVia is startReadyEnv with deptrace run by the command via
// (such as nohup) when it is not empty.
func startReadyVia(t *testing.T, via []string, env []string, ready string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	p := &proc{ready: make(chan struct{}), done: make(chan error, 1)}
	p.cmd = exec.CommandContext(ctx, binary, args...)
	if len(via) > 0 {
		p.cmd = exec.CommandContext(ctx, via[0], append(append(via[1:len(via):len(via)], binary), args...)...)
	}
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout = &p.stdout
	errPipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cmd.Process.Kill() })
	go p.collect(errPipe, ready)
	select {
	case <-p.ready:
	case err := <-p.done:
		t.Fatalf("deptrace %v exited: %v\n%s", args, err, p.errText())
	case <-time.After(30 * time.Second):
		t.Fatalf("deptrace %v not ready\n%s", args, p.errText())
	}
	return p
}

// The store goes down: the agent keeps tracing, spools, says so, and
// writes everything once the store is back.
func TestAgentSpoolsWhileStoreIsDown(t *testing.T) {
	testnet.RequireRoot(t)
	pg := pgtest.New(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	pg.Stop()

	spool := filepath.Join(t.TempDir(), "spool.jsonl")
	p := startReady(t, "msg=\"agent started\"", "agent", "--netns", b.Name, "--store", pg.DSN, "--interval", "1s", "--host-id", "spooltest", "--spool", spool, "--metrics-listen", "", "--pin-path", testPinPath(t, "spooltest"))
	tcpTraffic(t, nw, 7000, 3)
	eventually(t, 20*time.Second, "the agent spools while the store is down", func() error {
		if _, batches, err := agentSpoolStatus(spool); batches == 0 {
			return fmt.Errorf("nothing spooled (%v)\n%s", err, p.errText())
		}
		return nil
	})
	if out, _, _ := run(t, nil, "doctor", "--sample", "0", "--store", pg.DSN, "--spool", spool); !strings.Contains(out, "store         UNREACHABLE") || !strings.Contains(out, "waiting in "+spool) {
		t.Errorf("doctor does not report the outage:\n%s", out)
	}

	pg.Restart()
	// Only b runs an agent: the client is an external endpoint, not dropped.
	want := graph.Edge{From: graph.ExternalID(a.IPv4.String(), "", 0), To: graph.ServiceID("spooltest/"+b.Name, "tcp", 7000), Counters: tracer.Counters{Connections: 3}}
	eventually(t, 30*time.Second, "the spool is replayed into the store", func() error {
		if _, batches, err := agentSpoolStatus(spool); batches != 0 || err != nil {
			return fmt.Errorf("%d batches still spooled (%v)\n%s", batches, err, p.errText())
		}
		if n := storedConns(t, pg.DSN, want.To); n != want.Connections {
			return fmt.Errorf("the store holds %d of %d connections\n%s", n, want.Connections, p.errText())
		}
		return nil
	})
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t)
	if !strings.Contains(p.errText(), "spooling") {
		t.Errorf("the agent never said it was spooling:\n%s", p.errText())
	}

	stdout, stderr, code := run(t, nil, "graph", "--format", "json-v1", "--store", pg.DSN)
	if code != 0 {
		t.Fatal(stderr)
	}
	var g graph.Graph
	if err := json.Unmarshal([]byte(stdout), &g); err != nil {
		t.Fatalf("graph JSON: %v\n%s", err, stdout)
	}
	found := false
	for _, e := range g.Edges {
		if e.From == want.From && e.To == want.To && e.Connections == want.Connections {
			found = true
		}
	}
	if !found || len(g.Edges) != 1 {
		t.Errorf("want one edge %s -> %s with 3 connections, got:\n%s", want.From, want.To, stdout)
	}
}

var agentSpoolStatus = agent.SpoolStatus

// testPinPath is a pin path of this test's own, removed when it ends: the
// default one belongs to a real agent, and agents of one test must not
// share one.
func testPinPath(t *testing.T, name string) string {
	p := filepath.Join(filepath.Dir(tracer.DefaultPinPath), fmt.Sprintf("deptrace-test-%d-%s", os.Getpid(), name))
	t.Cleanup(func() { tracer.Cleanup(p) })
	return p
}

// An agent killed with SIGKILL loses nothing: its kernel side keeps
// counting, the next agent adopts it, and the store holds every connection
// (before the kill, while no agent ran, after), each once.
func TestAgentKilledLosesNothing(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	db := filepath.Join(t.TempDir(), "deptrace.db")
	pin := testPinPath(t, "killed")
	agentArgs := func(interval string) []string {
		return []string{"agent", "--netns", b.Name, "--store", db, "--interval", interval, "--host-id", "killtest",
			"--spool", filepath.Join(t.TempDir(), "spool"), "--metrics-listen", "", "--pin-path", pin, "--log-level", "debug"}
	}
	args := agentArgs("1s")

	ln := b.Listen(t, "tcp4", b.IPv4.String()+":7400")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, c) // a sink: the traced byte counts are the check
			c.Close()
		}
	}()
	connect := func(n int) {
		for i := 0; i < n; i++ {
			c, err := a.Dial("tcp4", b.IPv4.String()+":7400")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = c.Write([]byte("x")) // a short write shows in the counts checked below
			c.Close()
		}
	}

	// The first agent is killed before its first drain: what it never
	// drained is still in the kernel, counting on. (A kill while an
	// interval is being stored: TestAgentKilledWhileStoringLosesNothing.)
	first := startReady(t, "msg=\"agent started\"", agentArgs("1h")...)
	connect(30)
	first.cmd.Process.Kill() // the pinned kernel side counts on

	<-first.done //nolint:errcheck // killed on purpose: its exit error is the kill
	if _, err := os.Stat(pin); err != nil {
		t.Fatalf("the killed agent left no kernel side: %v", err)
	}
	connect(20) // no agent runs

	second := startReady(t, "msg=\"agent started\"", args...)
	if !strings.Contains(second.errText(), "adopted the kernel side") {
		t.Errorf("second agent did not adopt:\n%s", second.errText())
	}
	if _, _, code := run(t, nil, args...); code != 1 {
		t.Errorf("a third agent on the same pin path started (exit %d); want a refusal", code)
	}
	connect(10)
	service := graph.ServiceID("killtest/"+b.Name, "tcp", 7400)
	eventually(t, 30*time.Second, "the second agent stores every connection", func() error {
		if n := storedConns(t, db, service); n != 60 {
			return fmt.Errorf("the store holds %d of 60 connections", n)
		}
		return nil
	})
	second.cmd.Process.Signal(syscall.SIGTERM)
	second.wait(t)
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("a clean stop left the kernel side pinned: %v", err)
	}
	if !strings.Contains(second.errText(), `msg="agent stopped; kernel side detached"`) {
		t.Errorf("a clean stop logged no stop:\n%s", second.errText())
	}

	stdout, stderr, code := run(t, nil, "graph", "--format", "json-v1", "--store", db)
	if code != 0 {
		t.Fatal(stderr)
	}
	var g graph.Graph
	if err := json.Unmarshal([]byte(stdout), &g); err != nil {
		t.Fatalf("graph JSON: %v\n%s", err, stdout)
	}
	var conns uint64
	for _, e := range g.Edges {
		if e.To == graph.ServiceID("killtest/"+b.Name, "tcp", 7400) {
			conns += e.Connections
		}
	}
	if conns != 60 {
		t.Errorf("the store holds %d of 60 connections:\n%s\nfirst agent:\n%s\nsecond agent:\n%s", conns, stdout, first.errText(), second.errText())
	}
}

// storingWorld is a client and a server in namespaces of their own, a
// store, a spool and a pin path for agents tracing the server's namespace.
type storingWorld struct {
	t           *testing.T
	a, b        *testnet.Host
	port        int
	server      string
	db, spool   string
	pin         string
	unavailable string // a path under a regular file: nothing can be created there
}

func newStoringWorld(t *testing.T, name string, port int) *storingWorld {
	nw := testnet.New(t, 2)
	w := &storingWorld{t: t, a: nw.Hosts[0], b: nw.Hosts[1], port: port}
	dir := t.TempDir()
	w.db, w.spool, w.pin = filepath.Join(dir, "deptrace.db"), filepath.Join(dir, "spool"), testPinPath(t, name)
	blocker := filepath.Join(dir, "not-a-dir")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w.unavailable = blocker
	w.server = fmt.Sprintf("%s:%d", w.b.IPv4, port)
	ln := w.b.Listen(t, "tcp4", w.server)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, c) // a sink: the traced byte counts are the check
			c.Close()
		}
	}()
	return w
}

func (w *storingWorld) args(store, spool string) []string {
	return []string{"agent", "--netns", w.b.Name, "--store", store, "--interval", "1s", "--host-id", "killtest",
		"--spool", spool, "--metrics-listen", "", "--pin-path", w.pin, "--log-level", "debug"}
}

// metricsArgs is args with /metrics served on a free port.
func (w *storingWorld) metricsArgs(store, spool string) []string {
	args := w.args(store, spool)
	for i, a := range args {
		if a == "--metrics-listen" {
			args[i+1] = "127.0.0.1:0"
		}
	}
	return args
}

// collected waits until the agent serving url has collected connections
// to the server from the kernel (stored or not).
func (w *storingWorld) collected(url string, first *proc) {
	w.t.Helper()
	eventually(w.t, time.Minute, "the agent collects the connections", func() error {
		if n := inboundConns(w.t, url, w.port); n == 0 {
			return fmt.Errorf("no connection collected yet\n%s", first.errText())
		}
		return nil
	})
}

func (w *storingWorld) connect(n int) {
	w.t.Helper()
	for i := 0; i < n; i++ {
		c, err := w.a.Dial("tcp4", w.server)
		if err != nil {
			w.t.Fatal(err)
		}
		_, _ = c.Write([]byte("x")) // a short write shows in the counts checked below
		c.Close()
	}
}

// stored is how many connections to the server the store holds.
func (w *storingWorld) stored() uint64 {
	w.t.Helper()
	return storedConns(w.t, w.db, graph.ServiceID("killtest/"+w.b.Name, "tcp", uint16(w.port)))
}

// storedConns is how many connections to service the store holds.
func storedConns(t *testing.T, store, service string) uint64 {
	t.Helper()
	stdout, stderr, code := run(t, nil, "graph", "--format", "json-v1", "--store", store)
	if code != 0 {
		t.Fatal(stderr)
	}
	var g graph.Graph
	if err := json.Unmarshal([]byte(stdout), &g); err != nil {
		t.Fatalf("graph JSON: %v\n%s", err, stdout)
	}
	var conns uint64
	for _, e := range g.Edges {
		if e.To == service {
			conns += e.Connections
		}
	}
	return conns
}

// eventually polls cond (bounded by limit) until it returns nil.
func eventually(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	tracertest.Eventually(t, limit, what, cond)
}

// metricsURL is where agent p serves /metrics (started with
// --metrics-listen 127.0.0.1:0, it says where in its start lines).
func metricsURL(t *testing.T, p *proc) string {
	t.Helper()
	m := regexp.MustCompile(`msg="metrics served" .*url=(\S+)`).FindStringSubmatch(p.errText())
	if m == nil {
		t.Fatalf("no metrics URL in the agent's log:\n%s", p.errText())
	}
	return m[1]
}

// inboundConns sums the agent's inbound connection counters on port:
// what it collected from the kernel, whether or not it stored it.
func inboundConns(t *testing.T, url string, port int) float64 {
	t.Helper()
	var n float64
	for k, v := range scrapeMetrics(t, url) {
		if strings.HasPrefix(k, "deptrace_inbound_connections_total{") && strings.Contains(k, fmt.Sprintf("port=%q", strconv.Itoa(port))) {
			n += v
		}
	}
	return n
}

// waitLog waits (at most a minute) until p has logged text.
func waitLog(p *proc, text string) bool {
	for i := 0; i < 600; i++ {
		if strings.Contains(p.errText(), text) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// finish runs a second agent with the store reachable: it must collect
// the interval the first left uncommitted again, and the store must end
// with exactly the 60 connections made.
func (w *storingWorld) finish(first *proc) {
	w.t.Helper()
	second := startReady(w.t, "msg=\"agent started\"", w.args(w.db, w.spool)...)
	w.connect(10)
	// The interval the first agent left comes first: once the store
	// holds all 60, it was collected again and everything after it stored.
	eventually(w.t, time.Minute, "the second agent stores every connection", func() error {
		if n := w.stored(); n != 60 {
			return fmt.Errorf("the store holds %d of 60 connections", n)
		}
		return nil
	})
	second.cmd.Process.Signal(syscall.SIGTERM)
	second.wait(w.t)
	if !strings.Contains(second.errText(), "collected again an interval") {
		w.t.Errorf("the second agent did not collect the interval the first left uncommitted:\n%s", second.errText())
	}
	if n := w.stored(); n != 60 {
		w.t.Errorf("the store holds %d of 60 connections\nfirst agent:\n%s\nsecond agent:\n%s", n, first.errText(), second.errText())
	}
	if _, batches, _ := agentSpoolStatus(w.spool); batches != 0 {
		w.t.Errorf("%d batches left in the spool", batches)
	}
}

// An agent killed with SIGKILL in the middle of storing an interval loses
// nothing and counts nothing twice: after the interval is read from the
// kernel and before it is stored; after the store took it and before the
// kernel reset it; and, with the store down, after it went to the spool
// and before the reset. The agent is stopped at the exact point by its
// test hook (DEPTRACE_TEST_HALT), then killed. The next agent, with the
// store reachable, collects the interval again under the same batch id;
// the store holds every connection once.
func TestAgentKilledWhileStoringLosesNothing(t *testing.T) {
	testnet.RequireRoot(t)
	cases := []struct {
		name, halt string
		storeDown  bool
	}{
		{"read-not-stored", "collected", false},
		{"stored-not-reset", "stored", false},
		{"spooled-not-reset", "stored", true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newStoringWorld(t, "storing-"+tc.name, 7410+i)
			firstStore := w.db
			if tc.storeDown {
				firstStore = filepath.Join(w.unavailable, "deptrace.db") // the first agent spools everything
			}
			first := startReadyEnv(t, []string{"DEPTRACE_TEST_HALT=" + tc.halt}, "msg=\"agent started\"", w.metricsArgs(firstStore, w.spool)...)
			w.connect(30)
			// The agent halts for good on the first interval it stores
			// (the listener makes the first one non-empty): once it has
			// collected the connections, and with "stored" once the store
			// or the spool holds them, it is at the test point.
			w.collected(metricsURL(t, first), first)
			switch {
			case tc.halt == "stored" && tc.storeDown:
				eventually(t, time.Minute, "the first agent spools the interval", func() error {
					if _, batches, err := agentSpoolStatus(w.spool); batches == 0 {
						return fmt.Errorf("nothing spooled (%v)\n%s", err, first.errText())
					}
					return nil
				})
			case tc.halt == "stored":
				eventually(t, time.Minute, "the first agent stores the interval", func() error {
					if w.stored() == 0 {
						return fmt.Errorf("the store holds nothing\n%s", first.errText())
					}
					return nil
				})
			}
			first.cmd.Process.Kill()
			<-first.done //nolint:errcheck // killed on purpose: its exit error is the kill
			switch {
			case tc.storeDown:
				if _, batches, err := agentSpoolStatus(w.spool); err != nil || batches == 0 {
					t.Fatalf("the spool holds %d batches (%v); want the spooled interval\n%s", batches, err, first.errText())
				}
			case tc.halt == "stored":
				if n := w.stored(); n == 0 {
					t.Fatalf("the store holds nothing, yet the agent halted after storing:\n%s", first.errText())
				}
			}
			w.connect(20) // no agent runs
			w.finish(first)
		})
	}
}

// With the store down and the spool unwritable, an interval has nowhere
// to go: the agent does not commit it, collects the same interval again at
// the next drain (the kernel keeps counting meanwhile), and a clean stop
// leaves the kernel side pinned rather than destroy counts nobody stored.
// The next agent stores everything, once.
func TestAgentWithNowhereToStoreKeepsTheInterval(t *testing.T) {
	testnet.RequireRoot(t)
	w := newStoringWorld(t, "nowhere", 7420)
	first := startReady(t, "msg=\"agent started\"", w.metricsArgs(filepath.Join(w.unavailable, "deptrace.db"), filepath.Join(w.unavailable, "spool"))...)
	w.connect(30)
	// Collected, and stored nowhere: the kernel side keeps the interval.
	w.collected(metricsURL(t, first), first)
	first.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-first.done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(first.errText(), "the kernel side stays pinned") {
			t.Fatalf("a stop with an unstored interval: %v; want exit 1 saying the kernel side stays pinned\n%s", err, first.errText())
		}
	case <-time.After(time.Minute):
		t.Fatalf("the first agent did not stop:\n%s", first.errText())
	}
	if _, err := os.Stat(w.pin); err != nil {
		t.Fatalf("the kernel side was removed with an unstored interval in it: %v", err)
	}
	w.connect(20)
	w.finish(first)
}

package servicemap_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/browsertest"
	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/realtest"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
)

// The requests curl makes through nginx: ok to / (every backend once), and
// down to /down (a refused port and a port whose SYNs are dropped).
const (
	ok   = 20
	down = 4
)

// graphJSON is what `deptrace graph --format json` (format 2) and
// /api/graph say, as far as this test reads it.
type graphJSON struct {
	Format int `json:"format"`
	Nodes  []struct {
		ID       string `json:"id"`
		Kind     string `json:"kind"`
		Host     string `json:"host"`
		Name     string `json:"name"`
		Process  string `json:"process"`
		Addr     string `json:"addr"`
		Port     uint16 `json:"port"`
		Services []struct {
			Proto string `json:"proto"`
			Port  uint16 `json:"port"`
		} `json:"services"`
	} `json:"nodes"`
	Edges []edgeJSON `json:"edges"`
}

type edgeJSON struct {
	From              string   `json:"from"`
	To                string   `json:"to"`
	Proto             string   `json:"proto"`
	Port              uint16   `json:"port"`
	Connections       uint64   `json:"connections"`
	FailedConnections uint64   `json:"failed_connections"`
	FailedRefused     uint64   `json:"failed_refused"`
	FailedTimeout     uint64   `json:"failed_timeout"`
	DatagramsSent     uint64   `json:"datagrams_sent"`
	ResetsSent        uint64   `json:"resets_sent"`
	ResetsReceived    uint64   `json:"resets_received"`
	Retransmits       uint64   `json:"retransmits"`
	Health            string   `json:"health"`
	Unhealthy         bool     `json:"unhealthy"`
	Reasons           []string `json:"reasons"`
}

func (e edgeJSON) String() string {
	return fmt.Sprintf("%s -> %s %s/%d: %d connections, %d failed (%d refused, %d timed out), %d datagrams, %d resets, %d retransmits, %s %q",
		e.From, e.To, e.Proto, e.Port, e.Connections, e.FailedConnections, e.FailedRefused, e.FailedTimeout, e.DatagramsSent,
		e.ResetsSent+e.ResetsReceived, e.Retransmits, e.Health, e.Reasons)
}

// buildDeptrace builds the real binary from this checkout.
func buildDeptrace(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "deptrace")
	cmd := exec.Command("go", "build", "-o", bin, "../../cmd/deptrace")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/deptrace: %v\n%s", err, out)
	}
	return bin
}

// graph runs `deptrace graph --format json` over the store.
func graph(t *testing.T, bin, db string) graphJSON {
	t.Helper()
	code, out, errOut := realtest.Run(t, nil, 30*time.Second, bin, "graph", "--store", db, "--format", "json", "--since", "1h")
	if code != 0 {
		t.Fatalf("deptrace graph: exit %d: %s", code, errOut)
	}
	var g graphJSON
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatalf("deptrace graph: %v: %s", err, out)
	}
	return g
}

func (g graphJSON) edge(from, to, proto string, port uint16) (edgeJSON, bool) {
	for _, e := range g.Edges {
		if e.From == from && e.To == to && e.Proto == proto && e.Port == port {
			return e, true
		}
	}
	return edgeJSON{}, false
}

// about lists the nodes g has on the given hosts, its external nodes and
// every edge, for the log.
func (g graphJSON) about(hosts map[string]bool) string {
	var b strings.Builder
	for _, n := range g.Nodes {
		if hosts[n.Host] || n.Kind == "external" {
			fmt.Fprintf(&b, "\n  node %s (%s %q on %q, %s:%d)", n.ID, n.Kind, n.Name, n.Host, n.Addr, n.Port)
		}
	}
	for _, e := range g.Edges {
		fmt.Fprintf(&b, "\n  edge %s", e)
	}
	return b.String()
}

// TestServiceMapRealStack runs curl -> nginx -> a Python app under
// gunicorn -> redis-server, memcached, PostgreSQL and a UDP collector,
// each in a network namespace of its own, traces it with the real
// `deptrace agent`, and checks the map the real `deptrace serve` draws in
// headless Chromium: one labelled node per server program, the chain
// left to right, an edge's history on click, and health as rates (one
// retransmitted SYN among 20 connections stays ok; an edge whose every
// SYN is dropped and one to a refused port are unhealthy, with the
// reason on the page and in `deptrace look`).
func TestServiceMapRealStack(t *testing.T) {
	testnet.RequireRoot(t) // first: make test-unit skips it with nothing installed
	realtest.NeedPrograms(t, "nginx", "/usr/bin/gunicorn", "/usr/bin/python3", "redis-server", "memcached", "curl", "nft", "ss", "ip", "setpriv", "go")
	if _, err := pgtest.BinDir(); err != nil {
		realtest.NeedPrograms(t, "initdb") // fails under CI, skips elsewhere, naming it
	}
	browsertest.Chromium(t)
	nw := testnet.New(t, 8)
	start := time.Now()
	bin := buildDeptrace(t)
	t.Logf("built deptrace in %s", time.Since(start).Round(time.Millisecond))

	pgHost, downHost := nw.Hosts[5], nw.Hosts[7]
	// The first SYN to PostgreSQL is dropped (numgen starts at 0; fewer
	// than 1,000 SYNs come), so one connect of 20 retransmits it once.
	realtest.LoadNftRuleset(t, pgHost, `table ip servicemap {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport 5432 tcp flags & (syn | ack) == syn numgen inc mod 1000 == 0 counter drop
	}
}
`)
	// Every SYN to port 7002 of the down host is dropped; nothing listens
	// on 7001 there, so its kernel answers a reset (refused).
	realtest.LoadNftRuleset(t, downHost, `table ip servicemap {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport 7002 counter drop
	}
}
`)

	// The agent first, so that every server's listen() is seen.
	dir := t.TempDir()
	db := filepath.Join(dir, "deptrace.db")
	agent := realtest.StartDaemon(t, nil, dir, "agent", syscall.SIGTERM, bin, "agent", "--store", db, "--interval", "1s", "--pin-path", "",
		"--metrics-listen", "", "--spool", filepath.Join(dir, "spool.jsonl"), "--host-id", "servicemap", "--no-identity")
	tracertest.Eventually(t, 30*time.Second, "the agent started", func() error {
		agent.MustRun(t)
		if !strings.Contains(agent.Output(), "agent started") {
			return fmt.Errorf("agent output so far: %s", agent.Output())
		}
		return nil
	})
	s := startStack(t, nw)
	t.Logf("stack up %s after start", time.Since(start).Round(time.Millisecond))
	// The connect whose SYN is dropped opens from the retransmission
	// timer, in softirq: on the CI's kernel a thread of PID 1 may be the
	// task then, which hides it from every BPF program (tracertest's
	// initwitness.go).
	pgWitness := tracertest.WatchOpens(t, s.postgres.IPv4, 5432)

	url := fmt.Sprintf("http://%s/", s.nginx.IPv4)
	for i := 0; i < ok; i++ {
		code, out, errOut := realtest.Run(t, s.client, 20*time.Second, "curl", "-sS", "--max-time", "10", url)
		if want := "redis:+PONG memcached:VERSION postgres:ready collector:sent\n"; code != 0 || out != want {
			t.Fatalf("curl %s (%d): exit %d, %q %s; want %q", url, i, code, out, errOut, want)
		}
	}
	for i := 0; i < down; i++ {
		code, out, errOut := realtest.Run(t, s.client, 20*time.Second, "curl", "-sS", "--max-time", "10", url+"down")
		if want := "refused:ConnectionRefusedError dropped:TimeoutError\n"; code != 0 || out != want {
			t.Fatalf("curl %sdown (%d): exit %d, %q %s; want %q", url, i, code, out, errOut, want)
		}
	}
	if n := realtest.NftRulePackets(t, pgHost, "servicemap", "input", "dport 5432"); n != 1 {
		t.Fatalf("the rule dropped %d SYNs to PostgreSQL; want exactly 1", n)
	}
	if n := realtest.NftRulePackets(t, downHost, "servicemap", "input", "dport 7002"); n != down {
		t.Fatalf("the rule dropped %d SYNs to port 7002; want %d (one per 0.5 s connect, under the 1 s SYN retransmission)", n, down)
	}
	tracertest.Eventually(t, 10*time.Second, "the collector's datagrams", func() error {
		if n := strings.Count(s.collectorD.Output(), "requests:1|c\n"); n != ok {
			return fmt.Errorf("collector printed %d datagrams; want %d", n, ok)
		}
		return nil
	})
	t.Logf("traffic done %s after start", time.Since(start).Round(time.Millisecond))
	pgClient, pgServer := pgWitness.HiddenOpens(t)
	pgShort := uint64(max(pgClient, pgServer)) // whichever end the edge counts
	if pgShort > ok {
		t.Fatalf("the witness saw %d client and %d server opens to PostgreSQL hidden, of %d", pgClient, pgServer, ok)
	}

	host := func(h *testnet.Host) string { return "servicemap/" + h.Name }
	id := func(h *testnet.Host, comm string) string { return "workload:" + host(h) + "/" + comm }
	var (
		curl      = id(s.client, "curl")
		nginx     = id(s.nginx, "nginx")
		app       = id(s.app, "gunicorn")
		redis     = id(s.redis, "redis-server")
		memcached = id(s.memcached, "memcached")
		postgres  = id(s.postgres, "postgres")
		collector = id(s.collector, "python3")
	)
	type want struct {
		from, to, proto string
		port            uint16
		conns           uint64 // connections, or datagrams sent for UDP
		short           uint64 // of which the CI kernel hid the opens (tracertest.WatchOpens)
	}
	chain := []want{
		{curl, nginx, "tcp", 80, ok + down, 0}, {nginx, app, "tcp", 8000, ok + down, 0},
		{app, redis, "tcp", 6379, ok, 0}, {app, memcached, "tcp", 11211, ok, 0}, {app, postgres, "tcp", 5432, ok, pgShort}, {app, collector, "udp", 8125, ok, 0},
	}
	ours := map[string]bool{}
	for _, h := range nw.Hosts {
		ours[host(h)] = true
	}

	// The store has it all once the agent's intervals are written.
	var g graphJSON
	settled := func() error {
		g = graph(t, bin, db)
		for _, w := range chain {
			e, found := g.edge(w.from, w.to, w.proto, w.port)
			n := e.Connections
			if w.proto == "udp" {
				n = e.DatagramsSent
			}
			if !found || n < w.conns-w.short {
				return fmt.Errorf("edge %s -> %s %s/%d: %d of %d (found %v); the store's graph:%s", w.from, w.to, w.proto, w.port, n, w.conns, found, g.about(ours))
			}
		}
		failed := 0
		for _, e := range g.Edges {
			if e.From == app && e.FailedConnections >= down {
				failed++
			}
		}
		if failed < 2 {
			return fmt.Errorf("%d edges of the app with %d failed connections; want 2", failed, down)
		}
		return nil
	}
	tracertest.Eventually(t, 20*time.Second, "the agent stored the traffic", func() error { agent.MustRun(t); return settled() })
	agent.Stop(t, syscall.SIGTERM) // nothing more is traced: the page's own traffic is not on the map
	g = graph(t, bin, db)
	t.Logf("graph of the stack:%s", g.about(ours))

	// 1. One node per server program, named by it (nginx one node, not a
	// process and a service); every edge of the chain between them with
	// exactly the traffic made.
	for _, w := range chain {
		e, _ := g.edge(w.from, w.to, w.proto, w.port)
		n := e.Connections
		if w.proto == "udp" {
			n = e.DatagramsSent
		}
		if n < w.conns-w.short || n > w.conns || e.FailedConnections != 0 || e.ResetsSent+e.ResetsReceived != 0 {
			t.Errorf("edge %s: want %d (%d of them may be missing: opened where the kernel hides them) and no failures or resets", e, w.conns, w.short)
		}
	}
	perHost := map[string][]string{}
	for _, n := range g.Nodes {
		if ours[n.Host] {
			perHost[n.Host] = append(perHost[n.Host], n.ID)
			if n.Kind != "workload" {
				t.Errorf("node %s is a %q, want a workload", n.ID, n.Kind)
			}
		}
	}
	for h, want := range map[*testnet.Host]string{s.client: curl, s.nginx: nginx, s.app: app, s.redis: redis, s.memcached: memcached, s.postgres: postgres, s.collector: collector} {
		if got := perHost[host(h)]; len(got) != 1 || got[0] != want {
			t.Errorf("host %s has nodes %q; want one, %s", host(h), got, want)
		}
	}

	// 4 (store side). One retransmitted SYN in 20 connections: ok.
	pgEdge, _ := g.edge(app, postgres, "tcp", 5432)
	if pgEdge.Retransmits != 1 || pgEdge.Health != "ok" || pgEdge.Unhealthy || len(pgEdge.Reasons) != 0 {
		t.Errorf("app -> postgres: %s; want 1 retransmit and health ok, no reasons", pgEdge)
	}
	// The failing edges: to the down host's ports, whatever node deptrace
	// makes of a port nothing serves.
	var refused, dropped edgeJSON
	for _, e := range g.Edges {
		if e.From == app && e.Port == 7001 {
			refused = e
		}
		if e.From == app && e.Port == 7002 {
			dropped = e
		}
	}
	if refused.Connections != 0 || refused.FailedRefused != down || refused.FailedConnections != down || refused.Health != "unhealthy" ||
		!strings.Contains(strings.Join(refused.Reasons, "|"), fmt.Sprintf("%d of %d connection attempts failed (100.0 %%): %d refused", down, down, down)) {
		t.Errorf("refused edge: %s; want %d failed, all refused, unhealthy with the reason", refused, down)
	}
	if dropped.Connections != 0 || dropped.FailedTimeout != down || dropped.FailedConnections != down || dropped.Health != "unhealthy" ||
		!strings.Contains(strings.Join(dropped.Reasons, "|"), fmt.Sprintf("%d of %d connection attempts failed (100.0 %%): %d timed out", down, down, down)) {
		t.Errorf("dropped-SYN edge: %s; want %d failed, all timed out, unhealthy with the reason", dropped, down)
	}

	// deptrace look marks them, each with its cause and the rule that
	// fired (its line ends with "why: ..."); nothing else is
	// marked (the postgres edge with its retransmit is a plain line).
	code, lookOut, errOut := realtest.Run(t, nil, 30*time.Second, bin, "look", "--store", db, "--since", "1h", s.app.IPv4.String())
	t.Logf("deptrace look %s:\n%s", s.app.IPv4, lookOut)
	if code != 0 {
		t.Fatalf("deptrace look: exit %d: %s", code, errOut)
	}
	marked := 0
	for _, line := range strings.Split(lookOut, "\n") {
		bad := strings.Contains(line, "UNHEALTHY") || strings.Contains(line, "DEGRADED")
		if bad {
			marked++
		}
		switch {
		case strings.Contains(line, fmt.Sprintf("%s:7001 ", s.down.IPv4)):
			if w := fmt.Sprintf("UNHEALTHY  conns=0 failed=%d (refused=%d)", down, down); !strings.Contains(line, w) ||
				!strings.HasSuffix(line, fmt.Sprintf("  why: %d of %d connection attempts failed (100.0 %%): %d refused", down, down, down)) {
				t.Errorf("deptrace look, the refused edge: %q lacks %q or its reason", line, w)
			}
		case strings.Contains(line, fmt.Sprintf("%s:7002 ", s.down.IPv4)):
			if w := fmt.Sprintf("UNHEALTHY  conns=0 failed=%d (timeout=%d)", down, down); !strings.Contains(line, w) ||
				!strings.HasSuffix(line, fmt.Sprintf("  why: %d of %d connection attempts failed (100.0 %%): %d timed out", down, down, down)) {
				t.Errorf("deptrace look, the dropped-SYN edge: %q lacks %q or its reason", line, w)
			}
		case strings.Contains(line, "-> tcp/5432 postgres"):
			if bad || !strings.Contains(line, fmt.Sprintf("conns=%d failed=0", pgEdge.Connections)) || !strings.Contains(line, "retrans=1 ") {
				t.Errorf("deptrace look, app -> postgres (one retransmit in %d connections): %q, want it unmarked, with retrans=1", ok, line)
			}
		}
	}
	if marked != 2 {
		t.Errorf("deptrace look marks %d lines UNHEALTHY or DEGRADED; want the 2 failing edges only", marked)
	}

	// The page, served by the real deptrace serve over the store.
	pageURL := serve(t, bin, dir, db)
	ctx := browsertest.Browser(t, 60*time.Second)
	js := func(expr string) string { t.Helper(); return browsertest.JS[string](t, ctx, expr) }
	until := func(cond, show string) { t.Helper(); browsertest.Until(t, ctx, cond, show) }
	browsertest.Open(t, ctx, pageURL+"/?view=map&range=15m")
	until(`document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	// Every node of the stack labelled (sigma's drawn labels). The agent
	// traced the machine's root namespace too, where other programs may
	// have talked meanwhile (go test runs other packages beside this one):
	// their nodes may be on the map, and are not this test's.
	stackNodes := []string{curl, nginx, app, redis, memcached, postgres, collector, refused.To, dropped.To}
	ids, _ := json.Marshal(stackNodes)
	until(`(l => `+string(ids)+`.every(id => l.includes(id)))(window.deptrace.labelled())`, `[window.deptrace.labelled(), window.deptrace.display.nodes()]`)

	// 1. One node per server program on the page, each labelled by it.
	pageNodes := browsertest.JS[[]string](t, ctx, `window.deptrace.display.nodes().map(id => id + '=' + window.deptrace.display.getNodeAttribute(id, 'label'))`)
	t.Logf("nodes on the page: %q", pageNodes)
	labels := map[string]string{}
	for _, nl := range pageNodes {
		i := strings.LastIndex(nl, "=")
		labels[nl[:i]] = nl[i+1:]
		if nl[i+1:] == "" {
			t.Errorf("node %s has no label", nl[:i])
		}
	}
	for id, want := range map[string]string{curl: "curl", nginx: "nginx", app: "gunicorn", redis: "redis-server", memcached: "memcached", postgres: "postgres", collector: "python3"} {
		if labels[id] != want {
			t.Errorf("node %s labelled %q on the page, want %q", id, labels[id], want)
		}
	}
	for id := range labels {
		for h := range ours {
			if strings.HasPrefix(id, "workload:"+h+"/") || strings.HasPrefix(id, "process:"+h+"/") || strings.HasPrefix(id, "service:"+h+"/") {
				if id != curl && id != nginx && id != app && id != redis && id != memcached && id != postgres && id != collector {
					t.Errorf("node %s on the page: more than one node per server program on %s", id, h)
				}
			}
		}
	}

	// 2. The chain is a path of edges left to right.
	x := func(id string) float64 {
		t.Helper()
		return browsertest.JS[float64](t, ctx, `window.deptrace.position('`+id+`').x`)
	}
	for _, w := range chain {
		if !browsertest.JS[bool](t, ctx, `!!window.deptrace.display.edge('`+w.from+`', '`+w.to+`')`) {
			t.Errorf("no edge %s -> %s on the page", w.from, w.to)
		}
		if x(w.from) >= x(w.to) {
			t.Errorf("%s (x=%g) is not left of %s (x=%g)", w.from, x(w.from), w.to, x(w.to))
		}
	}
	for _, e := range []edgeJSON{refused, dropped} {
		if x(app) >= x(e.To) {
			t.Errorf("%s (x=%g) is not left of %s (x=%g)", app, x(app), e.To, x(e.To))
		}
	}
	browsertest.Screenshot(t, ctx, "servicemap-map")

	// 4 (page side). Colours and health as the page holds them.
	// Its health and colour as the page holds them (grey #9aa5b8 plain,
	// red #e03131 unhealthy).
	edgeHealth := func(from, to string) string {
		return js(`(G => (a => a.health + ' ' + a.color)(G.getEdgeAttributes(G.edge('` + from + `', '` + to + `'))))(window.deptrace.display)`)
	}
	if h := edgeHealth(app, postgres); h != "ok #9aa5b8" {
		t.Errorf("app -> postgres (one retransmit in %d connections) is %q on the page, want ok #9aa5b8 (not red)", ok, h)
	}
	for _, e := range []edgeJSON{refused, dropped} {
		if h := edgeHealth(e.From, e.To); h != "unhealthy #e03131" {
			t.Errorf("%s -> %s port %d is %q on the page, want unhealthy #e03131", e.From, e.To, e.Port, h)
		}
	}
	if d := js(`(d => d.nodes + ' nodes, ' + d.edges + ' edges, ' + d.unhealthy + ' unhealthy, ' + d.degraded + ' degraded')(document.querySelector('#map').dataset)`); !strings.HasSuffix(d, " 2 unhealthy, 0 degraded") {
		t.Errorf("map: %s; want the 2 failing edges unhealthy, nothing degraded", d)
	}

	// 3. Clicking app -> redis shows its history: a point per minute of
	// the 15 minutes (16 when the range starts inside a minute), as
	// uPlot holds them, and every connection made.
	js(`window.deptrace.clickEdge(window.deptrace.display.edge('` + app + `', '` + redis + `')), ''`)
	until(`!!document.querySelector('#details .history-chart canvas')`, `document.querySelector('#details').innerText`)
	lens := js(`(u => u.data.map(d => d.length).join(' ') + ' ' + u.series.length)(document.querySelector('#details .history-chart').uplot)`)
	if lens != "15 15 15 3" && lens != "16 16 16 3" {
		t.Errorf("history of app -> redis over 15 minutes: uPlot data lengths and series %q, want 15 (or 16) one-minute steps for x, connections and failed", lens)
	}
	if l := js(`document.querySelector('#details .history-chart').getAttribute('aria-label')`); l != fmt.Sprintf("connections per 1 min: %d in all, 0 failed", ok) {
		t.Errorf("history chart of app -> redis: %q", l)
	}
	browsertest.Screenshot(t, ctx, "servicemap-edge-history")

	// 4. The reasons, in the details of the failing edges and in the table.
	for _, e := range []edgeJSON{refused, dropped} {
		js(`window.deptrace.clickEdge(window.deptrace.display.edge('` + e.From + `', '` + e.To + `')), ''`)
		until(`document.querySelector('#details').innerText.includes('connection attempts failed')`, `document.querySelector('#details').innerText`)
		if d := js(`document.querySelector('#details').innerText`); !strings.Contains(d, "unhealthy: "+e.Reasons[0]) {
			t.Errorf("details of %s -> %s port %d lack %q:\n%s", e.From, e.To, e.Port, "unhealthy: "+e.Reasons[0], d)
		}
	}
	browsertest.Open(t, ctx, pageURL+"/?view=table&range=15m")
	rows := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#edges tbody tr')].map(r => r.className.trim() + ' | ' + r.innerText.replace(/\s+/g, ' '))`)
	found := map[string]bool{}
	for _, r := range rows {
		switch {
		case strings.Contains(r, s.postgres.IPv4.String()+":5432"):
			found["postgres"] = true
			if strings.Contains(r, "unhealthy") || strings.Contains(r, "degraded") || !strings.Contains(r, fmt.Sprintf(" tcp %d 0 0 ", pgEdge.Connections)) || !strings.Contains(r, " ok ") {
				t.Errorf("table row of app -> postgres (one retransmit) %q, want %d connections, 0 failed, ok", r, pgEdge.Connections)
			}
		case strings.Contains(r, s.down.IPv4.String()+":7001"):
			found["refused"] = true
			if w := fmt.Sprintf(" tcp 0 0 %[1]d 0 B 0 B unhealthy: %[1]d of %[1]d connection attempts failed (100.0 %%): %[1]d refused ", down); !strings.HasPrefix(r, "unhealthy |") || !strings.Contains(r, w) {
				t.Errorf("table row of the refused edge %q, want class unhealthy and %q (the state with its reason)", r, w)
			}
		case strings.Contains(r, s.down.IPv4.String()+":7002"):
			found["dropped"] = true
			if w := fmt.Sprintf(" tcp 0 0 %[1]d 0 B 0 B unhealthy: %[1]d of %[1]d connection attempts failed (100.0 %%): %[1]d timed out ", down); !strings.HasPrefix(r, "unhealthy |") || !strings.Contains(r, w) {
				t.Errorf("table row of the dropped-SYN edge %q, want class unhealthy and %q (the state with its reason)", r, w)
			}
		}
	}
	if len(found) != 3 {
		t.Errorf("table rows %q: found %v of postgres, refused, dropped", rows, found)
	}
	t.Logf("done %s after start", time.Since(start).Round(time.Millisecond))
}

// serve runs `deptrace serve` over the store on a free loopback port and
// returns its URL once it answers.
func serve(t *testing.T, bin, dir, db string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // freed for deptrace serve to take
	d := realtest.StartDaemon(t, nil, dir, "serve", syscall.SIGTERM, bin, "serve", "--store", db, "--listen", addr)
	tracertest.Eventually(t, 20*time.Second, "deptrace serve answers", func() error {
		d.MustRun(t)
		if !strings.Contains(d.Output(), "serving") {
			return fmt.Errorf("serve output so far: %s", d.Output())
		}
		return nil
	})
	return "http://" + addr
}

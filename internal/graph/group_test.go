package graph

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

var appContainer = tracer.Identity{ContainerID: "c0ffee0123456789abcdef", ContainerName: "app", ContainerRuntime: "docker"}

// curl -> nginx:80 -> app:8080 (gunicorn, in a container whose python3
// worker makes the calls) -> {redis:6379, postgres:5432}, every host
// running an agent, plus an external API.
func workloadChain() ([]store.Observation, []store.Host) {
	hs := []store.Host{
		{ID: "client", Addrs: []string{"198.51.100.1"}},
		{ID: "web", Addrs: []string{"198.51.100.2"}},
		{ID: "app", Addrs: []string{"198.51.100.3"}},
		{ID: "cache", Addrs: []string{"198.51.100.5"}},
		{ID: "db", Addrs: []string{"198.51.100.4"}},
	}
	in := func(x store.Observation) store.Observation { x.Identity = appContainer; return x }
	return []store.Observation{
		o("client", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", 5, 500, 5000),
		o("web", "inbound", "198.51.100.2", "198.51.100.1", 80, "nginx", 5, 5000, 500),
		o("web", "outbound", "198.51.100.2", "198.51.100.3", 8080, "nginx", 5, 600, 4000),
		in(o("app", "inbound", "198.51.100.3", "198.51.100.2", 8080, "gunicorn", 5, 4000, 600)),
		in(o("app", "outbound", "198.51.100.3", "198.51.100.5", 6379, "python3", 7, 70, 700)),
		o("cache", "inbound", "198.51.100.5", "198.51.100.3", 6379, "redis-server", 7, 700, 70),
		in(o("app", "outbound", "198.51.100.3", "198.51.100.4", 5432, "python3", 20, 100, 900)),
		o("db", "inbound", "198.51.100.4", "198.51.100.3", 5432, "postgres", 20, 900, 100),
		in(o("app", "outbound", "198.51.100.3", "203.0.113.7", 443, "python3", 1, 10, 20)),
	}, hs
}

// buildNamed is Load without a store: Build, then Name with the app
// container's identity.
func buildNamed(obs []store.Observation, hs []store.Host, ls []store.Listener) Graph {
	g := Build(obs, hs, ls)
	var ends []store.EndIdentity
	for _, x := range obs {
		if !x.Identity.Empty() {
			ends = append(ends, store.EndIdentity{HostID: x.HostID, Comm: x.Comm, Identity: x.Identity})
		}
	}
	Name(&g, ends)
	return g
}

func ids(g Graph) []string {
	var out []string
	for _, n := range g.Nodes {
		out = append(out, n.ID)
	}
	return out
}

// One node per workload on a host, its services as attributes, and the
// chain as a path of edges: not a process node and a service node per
// server with nothing between them.
func TestGroupMakesTheChainOneGraph(t *testing.T) {
	obs, hs := workloadChain()
	g := Group(buildNamed(obs, hs, nil), ByWorkload)
	app := "workload:app/container:" + appContainer.ContainerID
	want := []string{"external:203.0.113.7:443", "workload:cache/redis-server", "workload:client/curl", "workload:db/postgres", "workload:web/nginx", app}
	slices.Sort(want)
	if got := ids(g); !slices.Equal(got, want) {
		t.Fatalf("nodes %v, want %v", got, want)
	}
	if g.Format != 2 || len(g.Edges) != 5 {
		t.Fatalf("format %d, %d edges: %+v", g.Format, len(g.Edges), g.Edges)
	}
	for _, e := range [][2]string{
		{"workload:client/curl", "workload:web/nginx"}, {"workload:web/nginx", app},
		{app, "workload:cache/redis-server"}, {app, "workload:db/postgres"}, {app, "external:203.0.113.7:443"},
	} {
		edge(t, g, e[0], e[1])
	}
	if e := edge(t, g, app, "workload:db/postgres"); e.Proto != "tcp" || e.Port != 5432 || e.Connections != 20 || e.BytesSent != 100 {
		t.Errorf("app -> postgres: %+v", e)
	}
	a := node(t, g, app)
	if a.Kind != KindWorkload || a.Name != "app" || a.Process != "gunicorn,python3" || !slices.Equal(a.Processes, []string{"gunicorn", "python3"}) ||
		a.ContainerName != "app" || a.Addr != "198.51.100.3" || len(a.Services) != 1 || a.Services[0].String() != "tcp/8080" || a.Services[0].Process != "gunicorn" {
		t.Errorf("app container node: %+v", a)
	}
	if n := node(t, g, "workload:web/nginx"); len(n.Services) != 1 || n.Services[0].Port != 80 {
		t.Errorf("nginx: %+v", n)
	}
	// Walking from curl reaches every server: one chain.
	r := Reachable(g, []string{"workload:client/curl"}, 0, 0)
	if len(r.Nodes) != len(g.Nodes) || len(r.Edges) != len(g.Edges) || r.Format != 2 {
		t.Errorf("reachable from curl: %v", ids(r))
	}

	// By process the container's two processes are two nodes, still
	// chained: nginx -> gunicorn; python3 -> redis, postgres.
	p := Group(buildNamed(obs, hs, nil), ByProcess)
	edge(t, p, "workload:web/nginx", "workload:app/gunicorn")
	edge(t, p, "workload:app/python3", "workload:db/postgres")
	if len(p.Nodes) != 7 {
		t.Errorf("by process: %v", ids(p))
	}
	// By host: one node per host.
	h := Group(buildNamed(obs, hs, nil), ByHost)
	edge(t, h, "host:web", "host:app")
	if n := node(t, h, "host:app"); n.Kind != KindHost || n.Process != "gunicorn,python3" || n.ContainerID != "" {
		t.Errorf("host node: %+v", n)
	}
	if len(h.Nodes) != 6 {
		t.Errorf("by host: %v", ids(h))
	}
}

// look, Resolve, DOT, Mermaid and diff on a grouped graph.
func TestGroupedGraphQueriesAndPictures(t *testing.T) {
	obs, hs := workloadChain()
	g := Group(buildNamed(obs, hs, []store.Listener{{HostID: "db", Proto: "tcp", LocalAddr: "0.0.0.0", Port: 5432, Comm: "postgres", BacklogLimit: 16, QueueMax: 16, Drops: 2}}), ByWorkload)
	app := "workload:app/container:" + appContainer.ContainerID
	for target, want := range map[string]string{
		"198.51.100.3:8080": app, "app": app, "python3": app, "gunicorn": app, "redis": "workload:cache/redis-server",
		"198.51.100.4": "workload:db/postgres", "c0ffee0123456789": app,
	} {
		got, err := Resolve(g, hs, target)
		if err != nil || !slices.Equal(got, []string{want}) {
			t.Errorf("Resolve(%q) = %v, %v; want %s", target, got, err, want)
		}
	}
	pg := node(t, g, "workload:db/postgres")
	if !pg.Unhealthy || len(pg.Reasons) != 1 || !strings.HasPrefix(pg.Reasons[0], "tcp/5432: accept queue full: 2 handshake packets dropped") {
		t.Errorf("postgres: %+v", pg)
	}

	var buf bytes.Buffer
	WriteTrees(&buf, Look(g, []string{"workload:web/nginx"}, 0, true, true, 0), true, true)
	for _, want := range []string{
		"nginx on web (198.51.100.2)  [serves tcp/80]",
		"-> tcp/8080 app (gunicorn,python3) on app (198.51.100.3)  conns=5",
		"-> tcp/5432 postgres on db (198.51.100.4)  [listen backlog=16 queue_max=16 drops=2 DROPPING]  conns=20",
		"<- curl on client (198.51.100.1)  via tcp/80  conns=5",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("look lacks %q:\n%s", want, buf.String())
		}
	}

	buf.Reset()
	if err := Write(&buf, g, "dot"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"workload:web/nginx" [label="nginx on web (198.51.100.2)\nlistens tcp/80" shape=box]`) ||
		!strings.Contains(buf.String(), `"workload:web/nginx" -> "`+app+`" [label="tcp/8080 5 conns"]`) {
		t.Errorf("dot:\n%s", buf.String())
	}
	buf.Reset()
	if err := Write(&buf, g, "mermaid"); err != nil {
		t.Fatal(err)
	}
	if strings.Count(buf.String(), "-->|") != 5 || !strings.Contains(buf.String(), `["postgres on db (198.51.100.4)<br/>listens tcp/5432"]`) {
		t.Errorf("mermaid:\n%s", buf.String())
	}

	buf.Reset()
	if err := Write(&buf, g, "json"); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Format int
		Nodes  []map[string]any
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil || doc.Format != 2 {
		t.Fatalf("json: format %d, %v", doc.Format, err)
	}

	// Diff keys edges by their ends, protocol and port.
	before := Group(buildNamed(obs[:6], hs, nil), ByWorkload)
	appeared, disappeared := Diff(before, g)
	if len(appeared) != 2 || len(disappeared) != 0 {
		t.Errorf("diff: +%v -%v", appeared, disappeared)
	}
}

func TestValidGroupBy(t *testing.T) {
	for _, v := range GroupBys {
		if err := ValidGroupBy(v); err != nil {
			t.Error(err)
		}
	}
	if err := ValidGroupBy("pod"); err == nil || err.Error() != `invalid --group-by "pod": allowed workload, process, host` {
		t.Errorf("pod: %v", err)
	}
}

// A port clients asked for and nothing answered (every connect refused or
// timed out, no listener seen) is an attempted dependency: its service is
// unhealthy with the reason, look says nothing answers instead of
// "serves", and the pictures do not say it listens. A service that
// answered even once stays a listening one.
func TestUnansweredServiceIsNotListening(t *testing.T) {
	obs, hs := workloadChain()
	refused := o("client", "outbound", "198.51.100.1", "198.51.100.4", 7002, "curl", 0, 0, 0)
	refused.FailedConnections, refused.FailedRefused = 3, 3
	obs = append(obs, refused)
	g := Group(buildNamed(obs, hs, nil), ByWorkload)
	g.Judge(DefaultHealth)
	// No process is known behind the port: a workload of its own on db.
	asked := node(t, g, "workload:db/?tcp/198.51.100.4/7002")
	if len(asked.Services) != 1 || !asked.Services[0].Unanswered || !asked.Unhealthy ||
		!slices.Equal(asked.Reasons, []string{"tcp/7002: nothing answered: 3 connection attempts, none worked"}) {
		t.Errorf("the asked-for port: %+v", asked)
	}
	if pg := node(t, g, "workload:db/postgres"); len(pg.Services) != 1 || pg.Services[0].Unanswered || pg.Unhealthy {
		t.Errorf("postgres, which answered: %+v", pg)
	}

	var buf bytes.Buffer
	WriteTrees(&buf, Look(g, []string{"workload:client/curl"}, 0, true, false, 0), true, false)
	if !strings.Contains(buf.String(), "-> tcp/7002 ? on db (198.51.100.4)  [NOT ANSWERING]") || strings.Contains(buf.String(), "serves tcp/7002") {
		t.Errorf("look from the client:\n%s", buf.String())
	}
	buf.Reset()
	if err := Write(&buf, g, "dot"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `nothing answers tcp/7002"`) || strings.Contains(buf.String(), "listens tcp/7002") {
		t.Errorf("dot:\n%s", buf.String())
	}

	// Format 1: the service node itself.
	f1 := buildNamed(obs, hs, nil)
	f1.Judge(DefaultHealth)
	judged := 0
	for _, n := range f1.Nodes {
		if n.Kind != KindService || (n.Port != 7002 && n.Port != 5432) {
			continue
		}
		judged++
		if want := n.Port == 7002; n.Unanswered != want || n.Unhealthy != want {
			t.Errorf("format-1 service node %s: unanswered %v, unhealthy %v; want %v", n.ID, n.Unanswered, n.Unhealthy, want)
		}
	}
	if judged != 2 {
		t.Errorf("%d format-1 service nodes on ports 7002 and 5432, want 2", judged)
	}
}

// look ADDR:PORT of a workload that serves two ports shows the clients of
// that port only, as graph --target does; the workload's own dependencies
// stay. postgres serves 5432 (app) and 9187 (its exporter's metrics,
// scraped by prometheus and by app too).
func TestLookAtOneServiceOfAWorkload(t *testing.T) {
	obs, hs := workloadChain()
	hs = append(hs, store.Host{ID: "mon", Addrs: []string{"198.51.100.6"}})
	obs = append(obs,
		o("mon", "outbound", "198.51.100.6", "198.51.100.4", 9187, "prometheus", 3, 30, 300),
		o("db", "inbound", "198.51.100.4", "198.51.100.6", 9187, "postgres", 3, 300, 30),
		o("app", "outbound", "198.51.100.3", "198.51.100.4", 9187, "python3", 2, 20, 200),
		o("db", "inbound", "198.51.100.4", "198.51.100.3", 9187, "postgres", 2, 200, 20),
		o("db", "outbound", "198.51.100.4", "198.51.100.5", 6379, "postgres", 1, 10, 10),
	)
	for i := range obs {
		if obs[i].HostID == "app" {
			obs[i].Identity = appContainer
		}
	}
	g := Group(buildNamed(obs, hs, nil), ByWorkload)
	app := "workload:app/container:" + appContainer.ContainerID
	clients := func(tr Tree) []string {
		var out []string
		for _, b := range tr.Inbound {
			out = append(out, b.Peer.ID+"@"+strconv.Itoa(int(b.Edge.Port)))
		}
		slices.Sort(out)
		return out
	}
	for _, c := range []struct {
		target string
		want   []string
	}{
		{"198.51.100.4:5432", []string{app + "@5432"}},
		{"198.51.100.4:9187", []string{app + "@9187", "workload:mon/prometheus@9187"}},
		{"198.51.100.4", []string{app + "@5432", app + "@9187", "workload:mon/prometheus@9187"}},
	} {
		roots, err := Resolve(g, hs, c.target)
		if err != nil || !slices.Equal(roots, []string{"workload:db/postgres"}) {
			t.Fatalf("resolve %s: %v, %v", c.target, roots, err)
		}
		trees := Look(g, roots, 1, true, true, TargetPort(c.target))
		if got := clients(trees[0]); !slices.Equal(got, c.want) {
			t.Errorf("look %s: dependents %v, want %v", c.target, got, c.want)
		}
		if len(trees[0].Outbound) != 1 || trees[0].Outbound[0].Peer.ID != "workload:cache/redis-server" {
			t.Errorf("look %s: dependencies %+v, want the workload's own (redis)", c.target, trees[0].Outbound)
		}
		sub := Reachable(g, roots, 1, TargetPort(c.target))
		var edges []string
		for _, e := range sub.Edges {
			if e.To == "workload:db/postgres" {
				edges = append(edges, e.From+"@"+strconv.Itoa(int(e.Port)))
			}
		}
		slices.Sort(edges)
		if !slices.Equal(edges, c.want) {
			t.Errorf("graph --target %s: edges in %v, want %v", c.target, edges, c.want)
		}
	}
}

// One workload serving several unix sockets, one of them datagrams: the
// grouped edge from its client names every path it merges, and its
// volume counts the datagrams too (a unix datagram edge has no
// connections).
func TestGroupedUnixEdgeNamesItsSockets(t *testing.T) {
	dgram := func(dir, local, remote, comm, peer string, n uint64) store.Observation {
		x := unixObs("vm", dir, local, remote, comm, peer, 0, n*70, 0)
		if dir == "outbound" {
			x.DatagramsSent = n
		} else {
			x.BytesSent, x.BytesReceived, x.DatagramsReceived = 0, n*70, n
		}
		return x
	}
	hs := []store.Host{{ID: "vm", Addrs: []string{"198.51.100.9"}}}
	obs := []store.Observation{
		unixObs("vm", "outbound", "", "/run/us.sock", "client", "server", 2, 200, 300),
		unixObs("vm", "inbound", "/run/us.sock", "", "server", "client", 2, 300, 200),
		unixObs("vm", "outbound", "", "@abs", "client", "server", 3, 900, 1200),
		dgram("outbound", "", "/run/ud.sock", "client", "server", 5),
		dgram("inbound", "/run/ud.sock", "", "server", "", 5),
		dgram("outbound", "", "/run/log.sock", "logger", "server", 4),
	}
	g := Group(Build(obs, hs, nil), ByWorkload)
	e := edge(t, g, "workload:vm/client", "workload:vm/server")
	if want := []string{"/run/ud.sock", "/run/us.sock", "@abs"}; !slices.Equal(e.Addrs, want) || e.Connections != 5 || e.DatagramsSent != 5 {
		t.Errorf("client -> server: addrs %v, %d conns, %d datagrams; want %v, 5 and 5", e.Addrs, e.Connections, e.DatagramsSent, want)
	}
	var buf bytes.Buffer
	roots, _ := Resolve(g, hs, "client")
	WriteTrees(&buf, Look(g, roots, 1, true, true, 0), true, true)
	if want := "-> unix /run/ud.sock, /run/us.sock, @abs server on vm (198.51.100.9)  conns=5 failed=0 dgrams=5/0 "; !strings.Contains(buf.String(), want) {
		t.Errorf("look client lacks %q:\n%s", want, buf.String())
	}
	for format, want := range map[string]string{
		"dot":     `"workload:vm/client" -> "workload:vm/server" [label="unix 5 conns, 5 datagrams"]`,
		"mermaid": `unix 4 datagrams`,
	} {
		buf.Reset()
		if err := Write(&buf, g, format); err != nil || !strings.Contains(buf.String(), want) {
			t.Errorf("%s lacks %q:\n%s", format, want, buf.String())
		}
	}
	buf.Reset()
	var back Graph
	if err := Write(&buf, g, "json"); err != nil || json.Unmarshal(buf.Bytes(), &back) != nil {
		t.Fatalf("json: %v\n%s", err, buf.String())
	}
	if e := edge(t, back, "workload:vm/logger", "workload:vm/server"); !slices.Equal(e.Addrs, []string{"/run/log.sock"}) {
		t.Errorf("json: logger -> server addrs %v, want [/run/log.sock]", e.Addrs)
	}
}

// A target that names a container finds the node that gathers it in any
// grouping: grouped by host, a host node keeps no identity of its own
// (its processes may be several containers'), and the container was not
// found there.
func TestContainerTargetFindsItsGroup(t *testing.T) {
	obs, hs := workloadChain()
	raw := buildNamed(obs, hs, nil)
	byID := appContainer.ContainerID[:12]
	for by, want := range map[string]string{ByHost: "host:app", ByWorkload: "workload:app/container:" + appContainer.ContainerID} {
		g := Group(raw, by)
		got, err := Resolve(g, hs, byID)
		if err != nil || !slices.Equal(got, []string{want}) {
			t.Errorf("group by %s: target %s gives %v %v; want %s", by, byID, got, err, want)
		}
	}
	if _, err := Resolve(Group(raw, ByHost), hs, "c0ffee99999999"); err == nil {
		t.Errorf("group by host: a container id nothing has was found")
	}
}

package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// seedStore writes a small history: client -> web:80 -> db:5432 an hour
// ago, and web -> cache:6379 only in the last minutes.
func seedStore(t *testing.T, path string) string {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "deptrace.db")
	}
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	old := now.Add(-time.Hour)
	o := func(host, dir, local, remote string, port uint16, comm string, at time.Time) store.Observation {
		return store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: host, Direction: dir, Proto: "tcp", LocalAddr: local,
			RemoteAddr: remote, Port: port, Comm: comm, Counters: tracer.Counters{Connections: 4, BytesSent: 10, BytesReceived: 20}, FirstSeen: at, LastSeen: at}
	}
	unix := func(x store.Observation, peer string) store.Observation {
		x.Proto, x.PeerComm = "unix", peer
		return x
	}
	b := store.Batch{
		Hosts: []store.Host{
			{ID: "client", Name: "client", Addrs: []string{"198.51.100.1"}, LastSeen: now},
			{ID: "web", Name: "web", Addrs: []string{"198.51.100.2"}, LastSeen: now},
			{ID: "db", Name: "db", Addrs: []string{"198.51.100.3"}, LastSeen: now},
		},
		Observations: []store.Observation{
			o("client", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", old),
			o("web", "inbound", "198.51.100.2", "198.51.100.1", 80, "nginx", old),
			o("web", "outbound", "198.51.100.2", "198.51.100.3", 5432, "nginx", old),
			o("db", "inbound", "198.51.100.3", "198.51.100.2", 5432, "postgres", old),
			o("web", "outbound", "198.51.100.2", "203.0.113.5", 6379, "nginx", now.Add(-2*time.Minute)),
			unix(o("web", "outbound", "", "/run/app.sock", 0, "nginx", old), "gunicorn"),
			unix(o("web", "inbound", "/run/app.sock", "", 0, "gunicorn", old), "nginx"),
		},
		Listeners: []store.Listener{{Bucket: old.Truncate(time.Minute), HostID: "db", Proto: "tcp", LocalAddr: "0.0.0.0", Port: 5432, Comm: "postgres",
			BacklogLimit: 16, QueueMax: 16, Drops: 2, FirstSeen: old, LastSeen: old}},
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return path
}

// The same commands give the same answers on SQLite and on PostgreSQL.
func TestLookGraphDiffOnAStore(t *testing.T) {
	for name, spec := range map[string]string{"sqlite": "", "postgres": pgtest.Start(t)} {
		t.Run(name, func(t *testing.T) { lookGraphDiff(t, seedStore(t, spec)) })
	}
}

func lookGraphDiff(t *testing.T, db string) {

	// 2 drops of 6 connections: degraded by default (under 3 events),
	// unhealthy (DROPPING) from 2 events.
	out, errOut, code := run(t, nil, "look", "nginx", "--store", db, "--health-min-events", "2")
	if code != 0 {
		t.Fatal(errOut)
	}
	for _, want := range []string{
		"nginx on web (198.51.100.2)",
		"-> tcp/5432 postgres on db (198.51.100.3)  [listen backlog=16 queue_max=16 drops=2 DROPPING]  conns=4",
		"-> tcp 203.0.113.5:6379 (external)",
		"<- curl on client (198.51.100.1)  via tcp/80  conns=4",
		"-> unix /run/app.sock gunicorn on web (198.51.100.2)  conns=4",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("look lacks %q:\n%s", want, out)
		}
	}

	// Names as people type them: "gres" can only be postgres.
	out, _, code = run(t, nil, "look", "gres", "--store", db)
	if code != 0 || !strings.HasPrefix(out, "postgres on db (198.51.100.3)") {
		t.Errorf("look gres:\n%s", out)
	}

	out, _, _ = run(t, nil, "look", "postgres", "--reverse", "--store", db)
	if !strings.Contains(out, "<- nginx on web") || !strings.Contains(out, "   └─ <- curl on client") || strings.Contains(out, "depends on") {
		t.Errorf("look --reverse:\n%s", out)
	}

	out, _, _ = run(t, nil, "graph", "--format", "json", "--store", db)
	if !strings.Contains(out, `"health": "degraded"`) || !strings.Contains(out, `"drops": 2`) || !strings.Contains(out, "accept queue full") {
		t.Errorf("graph json does not flag the dropping service:\n%s", out)
	}
	out, _, _ = run(t, nil, "graph", "--format", "json", "--store", db, "--since", "10m")
	var g graph.Graph
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Edges) != 1 || g.Edges[0].Port != 6379 {
		t.Errorf("--since 10m should keep only the cache edge: %s", out)
	}
	out, _, _ = run(t, nil, "graph", "--format", "mermaid", "--store", db, "--target", "/run/app.sock")
	if !strings.Contains(out, "gunicorn on web (198.51.100.2)<br/>listens unix /run/app.sock") || !strings.Contains(out, `"unix 4 conns"`) || strings.Count(out, "-->|") != 2 { // nginx -> socket, and curl -> nginx above it
		t.Errorf("mermaid around the unix socket:\n%s", out)
	}
	out, _, _ = run(t, nil, "graph", "--format", "dot", "--store", db, "--target", "postgres", "--depth", "1")
	if !strings.HasPrefix(out, "digraph") || strings.Count(out, " -> ") != 1 {
		t.Errorf("dot around postgres at depth 1:\n%s", out)
	}

	out, _, _ = run(t, nil, "diff", "--since", "30m", "--store", db)
	if !strings.Contains(out, "+ nginx on web (198.51.100.2) -> tcp 203.0.113.5:6379 (external)") || strings.Count(out, "\n") != 1 {
		t.Errorf("diff of the last 30 min against the 30 before:\n%s", out)
	}
	out, _, _ = run(t, nil, "diff", "--since", "30m", "--before-since", "2h", "--before-until", "30m", "--store", db)
	if strings.Count(out, "\n- ") != 3 || strings.Count(out, "+ ") != 1 {
		t.Errorf("diff against the older window:\n%s", out)
	}
	// Each line names the service its edge enters, as look does.
	for _, want := range []string{
		"- curl on client (198.51.100.1) -> tcp/80 nginx on web (198.51.100.2)  conns=4",
		"- nginx on web (198.51.100.2) -> tcp/5432 postgres on db (198.51.100.3)  conns=4",
		"- nginx on web (198.51.100.2) -> unix /run/app.sock gunicorn on web (198.51.100.2)  conns=4",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("diff against the older window lacks %q:\n%s", want, out)
		}
	}
}

// Two edges between the same two workloads that differ only by port print
// as two lines that say which port.
func TestDiffTellsPortsApart(t *testing.T) {
	db := filepath.Join(t.TempDir(), "deptrace.db")
	s, err := store.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-5 * time.Minute).Truncate(time.Minute)
	var obs []store.Observation
	for _, port := range []uint16{8181, 8182} {
		for _, dir := range []string{"outbound", "inbound"} {
			obs = append(obs, store.Observation{Bucket: at, HostID: "vm", Direction: dir, Proto: "tcp", LocalAddr: "192.0.2.2", RemoteAddr: "192.0.2.2",
				Port: port, Comm: "measure.test", Counters: tracer.Counters{Connections: 1}, FirstSeen: at, LastSeen: at.Add(time.Second)})
		}
	}
	err = s.Write(context.Background(), store.Batch{Hosts: []store.Host{{ID: "vm", Name: "vm", Addrs: []string{"192.0.2.2"}, LastSeen: at}}, Observations: obs})
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, nil, "diff", "--since", at.Format(time.RFC3339), "--until", at.Add(time.Minute).Format(time.RFC3339), "--store", db)
	if code != 0 {
		t.Fatal(errOut)
	}
	for _, want := range []string{
		"+ measure.test on vm (192.0.2.2) -> tcp/8181 measure.test on vm (192.0.2.2)  conns=1 ",
		"+ measure.test on vm (192.0.2.2) -> tcp/8182 measure.test on vm (192.0.2.2)  conns=1 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("diff lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "\n") != 2 {
		t.Errorf("want two lines:\n%s", out)
	}
}

func TestQueryErrors(t *testing.T) {
	db := seedStore(t, "")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"look", "nosuchthing", "--store", db}, `no host, address, service or process matches "nosuchthing"`},
		{[]string{"look", "u", "--store", db}, `"u" matches several processes by substring: curl, gunicorn; give the full name`},
		{[]string{"look", "nginx", "--since", "last tuesday", "--store", db}, `invalid --since "last tuesday"`},
		{[]string{"look", "nginx", "--since", "1h", "--until", "2h", "--store", db}, "invalid range"},
		{[]string{"look", "nginx", "--depth", "-1", "--store", db}, "invalid --depth -1"},
		{[]string{"graph", "--format", "svg", "--store", db}, `invalid --format "svg": allowed json, json-v1, dot, mermaid`},
		{[]string{"graph", "--group-by", "pod", "--store", db}, `invalid --group-by "pod": allowed workload, process, host`},
		{[]string{"diff", "--since", "1h", "--group-by", "x", "--store", db}, `invalid --group-by "x"`},
		{[]string{"graph", "--store", filepath.Join(t.TempDir(), "none.db")}, "no store at"},
		{[]string{"graph", "--store", "postgres://nobody@/x?host=/nonexistent&connect_timeout=2"}, "connect to store"},
		{[]string{"diff", "--store", db}, "missing --since"},
		{[]string{"graph", "--health-failed-ratio", "2", "--store", db}, "invalid --health-failed-ratio 2: allowed 0 to 1"},
		{[]string{"look", "nginx", "--health-min-events", "0", "--store", db}, "invalid --health-min-events 0: allowed 1 to 1000000"},
		{[]string{"diff", "--since", "1h", "--health-reset-ratio", "-1", "--store", db}, "invalid --health-reset-ratio -1"},
		{[]string{"agent", "--retention", "5m"}, `invalid --retention "5m"`},
	}
	for _, c := range cases {
		stdout, stderr, code := run(t, nil, c.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], c.want) || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want one line with %q", c.args, code, stdout, stderr, c.want)
		}
	}
}

// seedChain writes curl -> nginx -> app -> {redis, postgres}, each on its
// own host, the app a container whose gunicorn serves and whose python3
// worker calls out: the map users expect is one chain.
func seedChain(t *testing.T, path string) string {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "deptrace.db")
	}
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now().Add(-5 * time.Minute)
	app := tracer.Identity{ContainerID: "c0ffee0123456789abcdef", ContainerName: "app", ContainerRuntime: "docker"}
	o := func(host, dir, local, remote string, port uint16, comm string, id tracer.Identity) store.Observation {
		return store.Observation{Bucket: now.Truncate(store.DefaultBucket), HostID: host, Direction: dir, Proto: "tcp", LocalAddr: local,
			RemoteAddr: remote, Port: port, Comm: comm, Identity: id, Counters: tracer.Counters{Connections: 4, BytesSent: 10, BytesReceived: 20}, FirstSeen: now, LastSeen: now}
	}
	none := tracer.Identity{}
	b := store.Batch{
		Hosts: []store.Host{
			{ID: "client", Name: "client", Addrs: []string{"198.51.100.1"}, LastSeen: now},
			{ID: "web", Name: "web", Addrs: []string{"198.51.100.2"}, LastSeen: now},
			{ID: "app", Name: "app", Addrs: []string{"198.51.100.3"}, LastSeen: now},
			{ID: "cache", Name: "cache", Addrs: []string{"198.51.100.5"}, LastSeen: now},
			{ID: "db", Name: "db", Addrs: []string{"198.51.100.4"}, LastSeen: now},
		},
		Observations: []store.Observation{
			o("client", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", none),
			o("web", "inbound", "198.51.100.2", "198.51.100.1", 80, "nginx", none),
			o("web", "outbound", "198.51.100.2", "198.51.100.3", 8080, "nginx", none),
			o("app", "inbound", "198.51.100.3", "198.51.100.2", 8080, "gunicorn", app),
			o("app", "outbound", "198.51.100.3", "198.51.100.5", 6379, "python3", app),
			o("cache", "inbound", "198.51.100.5", "198.51.100.3", 6379, "redis-server", none),
			o("app", "outbound", "198.51.100.3", "198.51.100.4", 5432, "python3", app),
			o("db", "inbound", "198.51.100.4", "198.51.100.3", 5432, "postgres", none),
		},
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return path
}

// A node is a workload on a host: the chain is one connected graph, on
// SQLite and on PostgreSQL, and format 1 stays available.
func TestGraphGroupsWorkloadsOnAStore(t *testing.T) {
	for name, spec := range map[string]string{"sqlite": "", "postgres": pgtest.Start(t)} {
		t.Run(name, func(t *testing.T) { groupedChain(t, seedChain(t, spec)) })
	}
}

func groupedChain(t *testing.T, db string) {
	const app = "workload:app/container:c0ffee0123456789abcdef"
	load := func(args ...string) graph.Graph {
		t.Helper()
		out, errOut, code := run(t, nil, append([]string{"graph", "--store", db}, args...)...)
		if code != 0 {
			t.Fatal(errOut)
		}
		var g graph.Graph
		if err := json.Unmarshal([]byte(out), &g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	pairs := func(g graph.Graph) []string {
		var ps []string
		for _, e := range g.Edges {
			ps = append(ps, e.From+" -> "+e.To)
		}
		return ps
	}
	g := load()
	want := []string{
		app + " -> workload:cache/redis-server", app + " -> workload:db/postgres",
		"workload:client/curl -> workload:web/nginx", "workload:web/nginx -> " + app,
	}
	if g.Format != 2 || len(g.Nodes) != 5 || !slices.Equal(pairs(g), want) {
		t.Errorf("format %d, %d nodes, edges %v; want %v", g.Format, len(g.Nodes), pairs(g), want)
	}
	for _, n := range g.Nodes {
		if n.ID == app && (n.Name != "app" || n.Process != "gunicorn,python3" || len(n.Services) != 1 || n.Services[0].Port != 8080) {
			t.Errorf("app node: %+v", n)
		}
	}
	if p := load("--group-by", "process"); len(p.Nodes) != 6 || !slices.Contains(pairs(p), "workload:app/python3 -> workload:db/postgres") {
		t.Errorf("by process: %v", pairs(p))
	}
	if h := load("--group-by", "host", "--target", "nginx"); len(h.Nodes) != 5 || !slices.Contains(pairs(h), "host:web -> host:app") {
		t.Errorf("by host: %v", pairs(h))
	}
	v1 := load("--format", "json-v1")
	if v1.Format != 0 || len(v1.Nodes) != 7 || !slices.Contains(pairs(v1), "process:web/nginx -> service:app/tcp/8080") {
		t.Errorf("json-v1: format %d, %d nodes, %v", v1.Format, len(v1.Nodes), pairs(v1))
	}

	out, _, _ := run(t, nil, "look", "curl", "--depth", "0", "--store", db)
	for _, want := range []string{
		"└─ -> tcp/80 nginx on web (198.51.100.2)",
		"└─ -> tcp/8080 app (gunicorn,python3) on app (198.51.100.3)",
		"├─ -> tcp/6379 redis-server on cache (198.51.100.5)",
		"└─ -> tcp/5432 postgres on db (198.51.100.4)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("look curl --depth 0 lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = run(t, nil, "graph", "--format", "mermaid", "--store", db)
	if strings.Count(out, "-->|") != 4 || !strings.Contains(out, `"app (gunicorn,python3) on app (198.51.100.3)<br/>listens tcp/8080"`) {
		t.Errorf("mermaid:\n%s", out)
	}
}

// Health by rates on a real store: one retransmitted segment in 90
// connections stays ok, a refused port is unhealthy with its reason, and
// the --health-* flags move the thresholds.
func TestHealthOnAStore(t *testing.T) {
	for name, spec := range map[string]string{"sqlite": "", "postgres": pgtest.Start(t)} {
		t.Run(name, func(t *testing.T) { healthOnAStore(t, spec) })
	}
}

func healthOnAStore(t *testing.T, path string) {
	if path == "" {
		path = filepath.Join(t.TempDir(), "deptrace.db")
	}
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-5 * time.Minute)
	o := func(port uint16, c tracer.Counters) store.Observation {
		return store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: "app", Direction: "outbound", Proto: "tcp", LocalAddr: "198.51.100.3",
			RemoteAddr: "198.51.100.4", Port: port, Comm: "python3", Counters: c, FirstSeen: at, LastSeen: at}
	}
	err = s.Write(context.Background(), store.Batch{
		Hosts: []store.Host{{ID: "app", Name: "app", Addrs: []string{"198.51.100.3"}, LastSeen: at}, {ID: "db", Name: "db", Addrs: []string{"198.51.100.4"}, LastSeen: at}},
		Observations: []store.Observation{
			o(5432, tracer.Counters{Connections: 90, Retransmits: 1}),
			o(5433, tracer.Counters{FailedConnections: 1, FailedRefused: 1}),
		},
	})
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, nil, "look", "python3", "--store", path)
	if code != 0 {
		t.Fatal(errOut)
	}
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.Contains(line, "tcp/5432"):
			if strings.Contains(line, "UNHEALTHY") || !strings.Contains(line, "retrans=1") {
				t.Errorf("one retransmit in 90 connections: %q", line)
			}
		case strings.Contains(line, "tcp/5433"):
			if !strings.Contains(line, "UNHEALTHY") {
				t.Errorf("refused port: %q", line)
			}
		}
	}
	out, _, _ = run(t, nil, "graph", "--store", path)
	var g graph.Graph
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatal(err)
	}
	for _, e := range g.Edges {
		if e.Port == 5433 && (!e.Unhealthy || len(e.Reasons) != 1 || e.Reasons[0] != "1 of 1 connection attempts failed (100.0 %): 1 refused") {
			t.Errorf("refused edge: %+v", e)
		}
	}
	out, _, _ = run(t, nil, "look", "python3", "--health-retransmits-per-conn", "0", "--health-min-events", "1", "--store", path)
	if strings.Count(out, "UNHEALTHY") != 2 {
		t.Errorf("strict thresholds should mark both edges:\n%s", out)
	}
}

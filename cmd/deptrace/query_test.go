package main

import (
	"context"
	"encoding/json"
	"path/filepath"
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

	out, errOut, code := run(t, nil, "look", "nginx", "--store", db)
	if code != 0 {
		t.Fatal(errOut)
	}
	for _, want := range []string{
		"nginx on web (198.51.100.2)",
		"-> tcp 198.51.100.3:5432 postgres on db  [listen backlog=16 queue_max=16 drops=2 DROPPING]  conns=4",
		"-> tcp 203.0.113.5:6379 (external)",
		"<- curl on client (198.51.100.1)  via tcp/80  conns=4",
		"-> unix /run/app.sock gunicorn on web  conns=4",
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
	if !strings.Contains(out, `"unhealthy": true`) || !strings.Contains(out, `"drops": 2`) || !strings.Contains(out, "accept queue full") {
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
	if !strings.Contains(out, "unix /run/app.sock gunicorn on web") || !strings.Contains(out, `"unix 4 conns"`) || strings.Count(out, "-->|") != 2 { // nginx -> socket, and curl -> nginx above it
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
		{[]string{"graph", "--format", "svg", "--store", db}, `invalid --format "svg": allowed json, dot, mermaid`},
		{[]string{"graph", "--store", filepath.Join(t.TempDir(), "none.db")}, "no store at"},
		{[]string{"graph", "--store", "postgres://nobody@/x?host=/nonexistent&connect_timeout=2"}, "connect to store"},
		{[]string{"diff", "--store", db}, "missing --since"},
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

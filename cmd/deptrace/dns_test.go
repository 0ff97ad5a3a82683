package main

// deptrace trace and agent with the DNS watcher: a client in a test
// namespace resolves names through dnsmasq (curl, glibc's getaddrinfo)
// and connects; its flows carry the names, and its lookups show as DNS
// records in jsonl and in the store.

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// dnsHosts makes host 1 a client resolving through dnsmasq on host 2,
// which answers web.test.example with host 3's IPv4 address (TTL 1 s) and
// NXDOMAIN for the rest of test.example; host 3 serves HTTP on 8080.
func dnsHosts(t *testing.T) *testnet.Network {
	t.Helper()
	for _, p := range []string{"dnsmasq", "curl"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is needed (scripts/deps.sh installs it): %v", p, err)
		}
	}
	nw := testnet.New(t, 3)
	client, ns, app := nw.Hosts[0], nw.Hosts[1], nw.Hosts[2]
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte(app.IPv4.String()+" web.test.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := ns.Command(context.Background(), "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
		"--bind-interfaces", "--listen-address="+ns.IPv4.String(), "--port=53", "--addn-hosts="+hosts, "--local=/test.example/",
		"--local-ttl=1", "--user=root", "--pid-file=")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	dir := filepath.Join("/etc/netns", client.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver "+ns.IPv4.String()+"\noptions timeout:1 attempts:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln := app.Listen(t, "tcp4", app.IPv4.String()+":8080")
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	// dnsmasq answers once it listens.
	deadline := time.Now().Add(10 * time.Second)
	for !curlOK(client, "http://web.test.example:8080/") {
		if time.Now().After(deadline) {
			t.Fatal("dnsmasq never answered web.test.example")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nw
}

func curlOK(h *testnet.Host, url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return h.Command(ctx, "curl", "-sS", "--max-time", "5", url).Run() == nil
}

// lookups has the client fetch the page twice and ask for a missing name
// once (NXDOMAIN, A and AAAA).
func lookups(t *testing.T, h *testnet.Host) {
	t.Helper()
	for range 2 {
		if !curlOK(h, "http://web.test.example:8080/") {
			t.Fatal("curl http://web.test.example:8080/ failed")
		}
	}
	if curlOK(h, "http://nosuch.test.example:8080/") {
		t.Fatal("nosuch.test.example resolved")
	}
}

func TestTraceNamesFlowsAndCountsLookups(t *testing.T) {
	nw := dnsHosts(t)
	client, ns, app := nw.Hosts[0], nw.Hosts[1], nw.Hosts[2]
	p := start(t, "trace", "--output", "jsonl", "--duration", "3s", "--netns", client.Name, "--dns-timeout", "1s")
	lookups(t, client)
	p.wait(t)
	var named, unnamed uint64
	var dns tracer.DNSCounters
	for _, line := range strings.Split(strings.TrimSpace(p.stdout.String()), "\n") {
		var rec struct {
			tracer.Flow
			Resolver string `json:"resolver"`
			tracer.DNSCounters
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		switch rec.Kind {
		case tracer.KindFlow:
			if rec.Proto == tracer.ProtoTCP && rec.Port == 8080 && rec.RemoteAddr == app.IPv4.String() {
				if rec.RemoteName == "web.test.example" {
					named += rec.Connections
				} else {
					unnamed += rec.Connections
				}
			}
		case tracer.KindDNS:
			if rec.Comm == "curl" && rec.Resolver == ns.IPv4.String()+":53" && rec.NetNS == client.Inode {
				dns.Add(rec.DNSCounters)
			}
		}
	}
	if named != 2 || unnamed != 0 {
		t.Errorf("curl's connections to web.test.example: %d named, %d unnamed; want 2 named\n%s", named, unnamed, p.stdout.String())
	}
	checkDNSWay(t, p)
	// Two lookups of web (A and AAAA: the AAAA answer is empty, NOERROR)
	// and one of nosuch (NXDOMAIN for both).
	if dns.Queries != 6 || dns.Answers != 6 || dns.NoError != 4 || dns.NXDomain != 2 || dns.Timeouts != 0 || dns.LatencyCount != 6 {
		t.Errorf("curl's lookups through %s: %+v\n%s", ns.IPv4, dns, p.stdout.String())
	}
}

// checkDNSWay checks that p's DNS watcher takes the tracer's calls from
// 6.3, where its send and receive programs hand them over, and watches
// packets before.
func checkDNSWay(t *testing.T, p *proc) {
	t.Helper()
	want := "variant=call in_tracer_calls=true"
	if !kernel.Has("btf_trace_sock_send_length") {
		want = "in_tracer_calls=false"
	}
	if !strings.Contains(p.errText(), want) {
		t.Errorf("the log lacks %q:\n%s", want, p.errText())
	}
}

func TestAgentStoresNamesAndLookups(t *testing.T) {
	nw := dnsHosts(t)
	client, ns, app := nw.Hosts[0], nw.Hosts[1], nw.Hosts[2]
	db := filepath.Join(t.TempDir(), "deptrace.db")
	p := startReady(t, "msg=\"agent started\"", "agent", "--netns", client.Name, "--store", db, "--interval", "1s", "--host-id", "dnstest",
		"--spool", filepath.Join(t.TempDir(), "spool"), "--metrics-listen", "", "--pin-path", testPinPath(t, "dns"))
	time.Sleep(time.Second) // the DNS watcher starts with the agent; let it attach
	lookups(t, client)
	time.Sleep(2 * time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	checkDNSWay(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
	var named uint64
	for _, o := range obs {
		if o.Proto == "tcp" && o.Port == 8080 && o.RemoteAddr == app.IPv4.String() && o.RemoteName == "web.test.example" {
			named += o.Connections
		}
	}
	if named != 2 {
		t.Errorf("stored connections to web.test.example (named): %d, want 2; %+v", named, obs)
	}
	recs, err := st.DNS(ctx, store.Range{})
	if err != nil {
		t.Fatal(err)
	}
	var dns tracer.DNSCounters
	for _, d := range recs {
		if d.Comm == "curl" && d.Resolver == ns.IPv4.String()+":53" {
			dns.Add(d.DNSCounters)
		}
	}
	if dns.Queries != 6 || dns.Answers != 6 || dns.NXDomain != 2 || dns.NoError != 4 {
		t.Errorf("stored lookups of curl: %+v; records %+v", dns, recs)
	}
}

func TestBadDNSFlagsAreOneLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"trace", "--dns-timeout", "1ms"}, nil, "invalid --dns-timeout 1ms: allowed 100ms to 5m"},
		{[]string{"agent", "--dns-timeout", "10m"}, nil, "invalid --dns-timeout 10m: allowed 100ms to 5m"},
		{[]string{"trace"}, []string{"DEPTRACE_DNS_TIMEOUT=soon"}, `invalid DEPTRACE_DNS_TIMEOUT="soon" for --dns-timeout`},
		{[]string{"trace"}, []string{"DEPTRACE_NO_DNS=maybe"}, `invalid DEPTRACE_NO_DNS="maybe" for --no-dns`},
	} {
		stdout, stderr, code := run(t, c.env, c.args...)
		if code != 1 || stdout != "" || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v %v: exit %d, stderr %q; want one line with %q", c.env, c.args, code, stderr, c.want)
		}
	}
}

// seedDNSHealth writes curl in container shop-curl on app connecting to
// postgres on db and resolving through 192.0.2.53:53: 2 of its 100
// lookups timed out, which the default DNS thresholds leave ok (under 3
// errors and 2.5 %).
func seedDNSHealth(t *testing.T, path string) string {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "deptrace.db")
	}
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Now().Add(-5 * time.Minute)
	o := func(host, dir, local, remote, comm string) store.Observation {
		return store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: host, Direction: dir, Proto: "tcp", LocalAddr: local,
			RemoteAddr: remote, Port: 5432, Comm: comm, Counters: tracer.Counters{Connections: 9, BytesSent: 90, BytesReceived: 900}, FirstSeen: at, LastSeen: at}
	}
	client := o("app", "outbound", "198.51.100.3", "198.51.100.4", "curl")
	client.Identity = tracer.Identity{ContainerID: "c0ffee0123456789", ContainerName: "shop-curl"}
	lookups := store.DNSObservation{Bucket: at.Truncate(time.Minute), HostID: "app", Comm: "curl", PID: 7, Proto: "udp", Resolver: "192.0.2.53:53",
		DNSCounters: tracer.DNSCounters{Queries: 100, Answers: 98, NoError: 98, Timeouts: 2, LatencyCount: 98, LatencySumUs: 98000, LatencyMaxUs: 7000},
		FirstSeen:   at, LastSeen: at}
	lookups.Identity = client.Identity
	err = s.Write(context.Background(), store.Batch{
		Hosts:        []store.Host{{ID: "app", Name: "app", Addrs: []string{"198.51.100.3"}, LastSeen: at}, {ID: "db", Name: "db", Addrs: []string{"198.51.100.4"}, LastSeen: at}},
		Observations: []store.Observation{client, o("db", "inbound", "198.51.100.4", "198.51.100.3", "postgres")},
		DNS:          []store.DNSObservation{lookups},
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// The --health-dns-* flags (and --health-degraded-factor) move the DNS
// thresholds of look, graph and serve, on both stores: curl's 2 timeouts
// in 100 lookups are ok by default, unhealthy at 1 % on 2 errors,
// degraded at 3 %, ok again with a degraded factor of 0.9.
func TestDNSHealthFlags(t *testing.T) {
	for name, spec := range map[string]string{"sqlite": "", "postgres": pgtest.Start(t)} {
		t.Run(name, func(t *testing.T) { dnsHealthFlags(t, seedDNSHealth(t, spec)) })
	}
}

const curlID = "workload:app/container:c0ffee0123456789"

func dnsHealthFlags(t *testing.T, db string) {
	const line = "192.0.2.53:53/udp queries=100 answers=98 nxdomain=0 servfail=0 other=0 timeouts=2 latency=1ms/7ms"
	for _, c := range []struct {
		env        []string
		flags      []string
		mark, want string
	}{
		{nil, nil, "", line + "\n"},
		{nil, []string{"--health-dns-error-ratio", "0.01", "--health-dns-min-events", "2"}, "  [DNS UNHEALTHY]", line + "  UNHEALTHY: 2 of 100 lookups failed (2.0 %): 2 timed out\n"},
		{[]string{"DEPTRACE_HEALTH_DNS_ERROR_RATIO=0.01", "DEPTRACE_HEALTH_DNS_MIN_EVENTS=2"}, nil, "  [DNS UNHEALTHY]", line + "  UNHEALTHY: 2 of 100 lookups failed (2.0 %): 2 timed out\n"},
		{nil, []string{"--health-dns-error-ratio", "0.03"}, "  [DNS DEGRADED]", line + "  DEGRADED: 2 of 100 lookups failed (2.0 %): 2 timed out\n"},
		{nil, []string{"--health-dns-error-ratio", "0.03", "--health-degraded-factor", "0.9"}, "", line + "\n"},
	} {
		// The client by its container's name, and by its process.
		for _, target := range []string{"shop-curl", "curl"} {
			out, errOut, code := run(t, c.env, append([]string{"look", target, "--store", db}, c.flags...)...)
			if code != 0 {
				t.Fatalf("look %s %v %v: %d %s", target, c.env, c.flags, code, errOut)
			}
			if !strings.HasPrefix(out, "shop-curl (curl) on app (198.51.100.3)"+c.mark+"\n  DNS lookups (per resolver):\n    "+c.want) {
				t.Errorf("look %s %v %v:\n%s\nwant the mark %q and the DNS line %q", target, c.env, c.flags, out, c.mark, c.want)
			}
		}
		// The server's view marks the client among its dependents.
		out, _, _ := run(t, c.env, append([]string{"look", "postgres", "--store", db}, c.flags...)...)
		if want := "    └─ <- shop-curl (curl) on app (198.51.100.3)" + c.mark + "  via tcp/5432  conns=9 "; !strings.Contains(out, want) {
			t.Errorf("look postgres %v %v:\n%s\nwant %q", c.env, c.flags, out, want)
		}
	}
	// graph: the client's node is unhealthy with the DNS reason, and
	// drawn red in DOT.
	strict := []string{"--health-dns-error-ratio", "0.01", "--health-dns-min-events", "2", "--store", db}
	for _, flags := range [][]string{{"--store", db}, strict} {
		out, errOut, code := run(t, nil, append([]string{"graph"}, flags...)...)
		if code != 0 {
			t.Fatalf("graph %v: %d %s", flags, code, errOut)
		}
		var g graph.Graph
		if err := json.Unmarshal([]byte(out), &g); err != nil {
			t.Fatal(err)
		}
		curl := nodeByID(g, curlID)
		wantBad := len(flags) > 2
		if curl.Unhealthy != wantBad || (wantBad && (len(curl.Reasons) != 1 || curl.Reasons[0] != "DNS via 192.0.2.53:53/udp: 2 of 100 lookups failed (2.0 %): 2 timed out")) ||
			(!wantBad && curl.Health != graph.HealthOK) {
			t.Errorf("graph %v: curl %+v", flags, curl)
		}
		dot, _, _ := run(t, nil, append([]string{"graph", "--format", "dot"}, flags...)...)
		if red := strings.Contains(dot, `"`+curlID+`" [label="shop-curl (curl) on app (198.51.100.3)\nDNS: 2 of 100 lookups failed" shape=box color=red]`); red != wantBad {
			t.Errorf("graph --format dot %v: curl red %v, want %v\n%s", flags, red, wantBad, dot)
		}
	}
	// serve hands the thresholds to the API: /api/dns, /api/graph and
	// /api/look judge curl by them.
	p := startReady(t, "msg=serving", append([]string{"serve", "--listen", "127.0.0.1:0"}, strict...)...)
	base := regexp.MustCompile(`url=(http://\S+/)`).FindStringSubmatch(p.errText())
	if base == nil {
		t.Fatalf("no url in %q", p.errText())
	}
	get := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(base[1] + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	var dns struct {
		Clients []struct {
			Process, Health string
			Resolvers       []graph.DNSStats
		}
	}
	get("api/dns?since=1h", &dns)
	if len(dns.Clients) != 1 || dns.Clients[0].Process != "curl" || dns.Clients[0].Health != graph.HealthUnhealthy ||
		len(dns.Clients[0].Resolvers) != 1 || strings.Join(dns.Clients[0].Resolvers[0].Reasons, ";") != "2 of 100 lookups failed (2.0 %): 2 timed out" {
		t.Errorf("serve %v: /api/dns %+v", strict, dns)
	}
	var g graph.Graph
	get("api/graph?since=1h", &g)
	if curl := nodeByID(g, curlID); !curl.Unhealthy {
		t.Errorf("serve %v: /api/graph curl %+v", strict, curl)
	}
	var look struct{ Trees []struct{ Root graph.Node } }
	get("api/look?target=shop-curl", &look)
	if len(look.Trees) != 1 || !look.Trees[0].Root.Unhealthy || len(look.Trees[0].Root.DNS) != 1 || look.Trees[0].Root.DNS[0].Health != graph.HealthUnhealthy {
		t.Errorf("serve %v: /api/look %+v", strict, look)
	}
}

func nodeByID(g graph.Graph, id string) graph.Node {
	for _, n := range g.Nodes {
		if n.ID == id {
			return n
		}
	}
	return graph.Node{}
}

// A DNS threshold out of range is one line naming the flag and what is
// allowed, on every command that takes it.
func TestBadDNSHealthFlags(t *testing.T) {
	db := seedDNSHealth(t, "")
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"look", "curl", "--health-dns-error-ratio", "1.5"}, nil, "invalid --health-dns-error-ratio 1.5: allowed 0 to 1"},
		{[]string{"graph", "--health-dns-error-ratio", "-0.1"}, nil, "invalid --health-dns-error-ratio -0.1: allowed 0 to 1"},
		{[]string{"graph", "--health-dns-error-ratio", "NaN"}, nil, "invalid --health-dns-error-ratio NaN: allowed 0 to 1"},
		{[]string{"diff", "--since", "1h", "--health-dns-min-events", "0"}, nil, "invalid --health-dns-min-events 0: allowed 1 to 1000000"},
		{[]string{"look", "curl", "--health-dns-min-events", "1000001"}, nil, "invalid --health-dns-min-events 1000001: allowed 1 to 1000000"},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--health-dns-error-ratio", "2"}, nil, "invalid --health-dns-error-ratio 2: allowed 0 to 1"},
		{[]string{"serve", "--listen", "127.0.0.1:0"}, []string{"DEPTRACE_HEALTH_DNS_MIN_EVENTS=0"}, "invalid --health-dns-min-events 0: allowed 1 to 1000000"},
		{[]string{"look", "curl", "--health-degraded-factor", "0"}, nil, "invalid --health-degraded-factor 0: allowed more than 0, up to 1"},
	} {
		stdout, stderr, code := run(t, c.env, append(c.args, "--store", db)...)
		if code != 1 || stdout != "" || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v %v: exit %d, stderr %q; want one line with %q", c.env, c.args, code, stderr, c.want)
		}
	}
}

// TestDNSLossesWarnOncePerRise: trace and the agent warn when the DNS
// watcher loses packets, once per interval that adds some, with how many
// it added.
func TestDNSLossesWarnOncePerRise(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var d dnsLosses
	for _, st := range []dnswatch.Stats{{}, {Lost: 3}, {Lost: 3}, {Lost: 5}, {Lost: 5, Unreadable: 4}, {Lost: 5, Unreadable: 4}} {
		d.warn(st, log)
	}
	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{"lost=3", "lost=2", "unreadable=4"}
	if len(got) != len(want) {
		t.Fatalf("warnings:\n%s\nwant %d", buf.String(), len(want))
	}
	for i, w := range want {
		if !strings.Contains(got[i], w) || !strings.Contains(got[i], "level=WARN") {
			t.Errorf("warning %d: %q; want one with %s", i, got[i], w)
		}
	}
}

package main

// deptrace trace and agent with the DNS watcher: a client in a test
// namespace resolves names through dnsmasq (curl, glibc's getaddrinfo)
// and connects; its flows carry the names, and its lookups show as DNS
// records in jsonl and in the store.

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
	// Two lookups of web (A and AAAA: the AAAA answer is empty, NOERROR)
	// and one of nosuch (NXDOMAIN for both).
	if dns.Queries != 6 || dns.Answers != 6 || dns.NoError != 4 || dns.NXDomain != 2 || dns.Timeouts != 0 || dns.LatencyCount != 6 {
		t.Errorf("curl's lookups through %s: %+v\n%s", ns.IPv4, dns, p.stdout.String())
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
		{[]string{"trace", "--dns-timeout", "1ms"}, nil, "invalid --dns-timeout 1ms: allowed 100ms to 5m0s"},
		{[]string{"agent", "--dns-timeout", "10m"}, nil, "invalid --dns-timeout 10m0s: allowed 100ms to 5m0s"},
		{[]string{"trace"}, []string{"DEPTRACE_DNS_TIMEOUT=soon"}, `invalid DEPTRACE_DNS_TIMEOUT="soon" for --dns-timeout`},
		{[]string{"trace"}, []string{"DEPTRACE_NO_DNS=maybe"}, `invalid DEPTRACE_NO_DNS="maybe" for --no-dns`},
	} {
		stdout, stderr, code := run(t, c.env, c.args...)
		if code != 1 || stdout != "" || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v %v: exit %d, stderr %q; want one line with %q", c.env, c.args, code, stderr, c.want)
		}
	}
}

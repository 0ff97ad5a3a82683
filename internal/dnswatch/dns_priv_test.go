package dnswatch_test

// Real resolvers in test namespaces (dnsmasq from Debian, a tiny server
// that answers SERVFAIL, one whose queries an nftables rule drops), real
// clients (curl through glibc's getaddrinfo, dig): the flows the clients
// open carry the name they asked for, and each client's lookups are
// counted exactly per resolver.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// acc sums what the tracer and the watcher report over intervals.
type acc struct {
	t     *testing.T
	tr    *tracer.Tracer
	w     *dnswatch.Watcher
	names map[string]string // flow id -> RemoteName
	flows map[string]tracer.Flow
	dns   map[dnsKey]*tracer.DNSCounters
}

type dnsKey struct {
	netns    uint32
	comm     string
	proto    tracer.Proto
	resolver string
}

func startWatch(t *testing.T, timeout time.Duration, variant string) *acc {
	t.Helper()
	a, err := watch(t, timeout, variant)
	if err != nil {
		t.Fatalf("dns watcher: %v", err)
	}
	return a
}

// watch starts a tracer and the watcher's variant (""; the default) in
// its calls, as trace and agent do; the error is the watcher's.
func watch(t *testing.T, timeout time.Duration, variant string) (*acc, error) {
	t.Helper()
	tr := tracertest.Start(t, nil)
	cfg := dnswatch.DefaultConfig()
	cfg.Timeout = timeout
	cfg.Variant = variant
	cfg.Calls = tr
	w, err := dnswatch.New(cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = w.Close() })
	return &acc{t: t, tr: tr, w: w, names: map[string]string{}, flows: map[string]tracer.Flow{}, dns: map[dnsKey]*tracer.DNSCounters{}}, nil
}

func (a *acc) collect() {
	iv := tracertest.Collect(a.t, a.tr)
	a.w.Apply(&iv)
	for _, f := range iv.Flows {
		id := tracertest.FlowID(f)
		a.flows[id] = f
		if f.RemoteName != "" {
			if old := a.names[id]; old != "" && old != f.RemoteName {
				a.t.Errorf("flow %s named %q, then %q", id, old, f.RemoteName)
			}
			a.names[id] = f.RemoteName
		}
	}
	for _, d := range iv.DNS {
		k := dnsKey{d.NetNS, d.Comm, d.Proto, d.Resolver}
		if a.dns[k] == nil {
			a.dns[k] = &tracer.DNSCounters{}
		}
		a.dns[k].Add(d.DNSCounters)
	}
}

// settle collects until done holds, for at most 20 s, then once more.
func (a *acc) settle(what string, done func() bool) {
	a.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		a.collect()
		if done() {
			a.collect()
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s: not seen within 20 s; flows %v; dns %v", what, a.flowList(), a.dnsList())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (a *acc) flowList() string {
	var b strings.Builder
	for id, f := range a.flows {
		fmt.Fprintf(&b, "\n  %s name=%q conns=%d", id, a.names[id], f.Connections)
	}
	return b.String()
}

func (a *acc) dnsList() string {
	var b strings.Builder
	for k, c := range a.dns {
		fmt.Fprintf(&b, "\n  %+v %+v", k, *c)
	}
	return b.String()
}

// named returns the name of the outbound flow from h to addr:port ("" if
// unnamed) and whether there is such a flow.
func (a *acc) named(h *testnet.Host, proto tracer.Proto, addr netip.Addr, port uint16) (string, bool) {
	for id, f := range a.flows {
		if f.NetNS == h.Inode && f.Proto == proto && f.Direction == tracer.Outbound && f.RemoteIP() == addr && f.Port == port {
			return a.names[id], true
		}
	}
	return "", false
}

func (a *acc) counters(h *testnet.Host, comm string, proto tracer.Proto, resolver string) tracer.DNSCounters {
	c := a.dns[dnsKey{h.Inode, comm, proto, resolver}]
	if c == nil {
		return tracer.DNSCounters{}
	}
	return *c
}

func need(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is needed (scripts/deps.sh installs dnsmasq-base, bind9-dnsutils, curl, nftables): %v", p, err)
		}
	}
}

// resolvConf makes `ip netns exec` give h this resolv.conf.
func resolvConf(t *testing.T, h *testnet.Host, content string) {
	t.Helper()
	dir := filepath.Join("/etc/netns", h.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dnsmasq runs dnsmasq in h on h's IPv4 address, port 53, answering
// test.example from hostsFile (NXDOMAIN for names it lacks, nothing
// forwarded), every answer with a TTL of 1 s.
func dnsmasq(t *testing.T, h *testnet.Host, hostsFile string, extra ...string) *exec.Cmd {
	t.Helper()
	args := append([]string{"--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces",
		"--listen-address=" + h.IPv4.String(), "--port=53", "--addn-hosts=" + hostsFile, "--local=/test.example/",
		"--local-ttl=1", "--user=root", "--pid-file=", "--log-facility=-"}, extra...)
	cmd := h.Command(context.Background(), "dnsmasq", args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("dnsmasq in %s:\n%s", h.Name, out.String())
		}
	})
	return cmd
}

// answerCode serves DNS on addr:53 in h, answering every query with rcode.
func answerCode(t *testing.T, h *testnet.Host, rcode dnsmessage.RCode) {
	t.Helper()
	pc := h.ListenPacket(t, "udp4", net.JoinHostPort(h.IPv4.String(), "53"))
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			hd, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hd.ID, Response: true, RCode: rcode, RecursionDesired: hd.RecursionDesired})
			_ = b.StartQuestions()
			_ = b.Question(q)
			out, err := b.Finish()
			if err == nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
}

// serveHTTP answers HTTP on port 8080 of every address of h.
func serveHTTP(t *testing.T, h *testnet.Host) {
	t.Helper()
	ln := h.Listen(t, "tcp", ":8080")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// run runs a program in h, bounded by 20 s; its error is returned, not
// fatal (dig exits non-zero on a timeout).
func run(t *testing.T, h *testnet.Host, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := h.Command(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func mustRun(t *testing.T, h *testnet.Host, name string, args ...string) string {
	t.Helper()
	out, err := run(t, h, name, args...)
	if err != nil {
		t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), h.Name, err, out)
	}
	return out
}

// dial connects from h to addr:8080 and reads the HTTP answer's first
// bytes, as a client that resolved the name with dig would.
func dial(t *testing.T, h *testnet.Host, addr netip.Addr) {
	t.Helper()
	c, err := h.Dial("tcp", netip.AddrPortFrom(addr, 8080).String())
	if err != nil {
		t.Fatalf("connect %s from %s: %v", addr, h.Name, err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Read(make([]byte, 64))
}

func writeHosts(t *testing.T, path string, lines ...string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func addr(ip net.IP) netip.Addr { a, _ := netip.AddrFromSlice(ip); return a.Unmap() }

// TestNamesAndHealth: names from A, AAAA and a CNAME chain, asked through
// getaddrinfo (curl) and dig; a name whose TTL ran out and now points
// elsewhere; NXDOMAIN, SERVFAIL and timeouts counted exactly per client
// and resolver; a large answer that truncates over UDP, read over TCP.
func TestNamesAndHealth(t *testing.T) {
	need(t, "dnsmasq", "dig", "curl", "nft")
	nw := testnet.New(t, 6)
	client, ns, failing, dropped, appA, appB := nw.Hosts[0], nw.Hosts[1], nw.Hosts[2], nw.Hosts[3], nw.Hosts[4], nw.Hosts[5]
	moving1, moving2 := netip.MustParseAddr("198.51.100.150"), netip.MustParseAddr("198.51.100.151")
	for _, a := range []netip.Addr{moving1, moving2} {
		mustRun(t, appB, "ip", "addr", "add", a.String()+"/24", "dev", "eth0")
	}
	hosts := filepath.Join(t.TempDir(), "hosts")
	lines := []string{
		appA.IPv4.String() + " api.test.example",
		appA.IPv6.String() + " api.test.example",
		appB.IPv4.String() + " backend.test.example",
		appB.IPv6.String() + " v6.test.example",
		moving1.String() + " moving.test.example",
	}
	for i := 1; i <= 120; i++ {
		lines = append(lines, fmt.Sprintf("203.0.113.%d big.test.example", i))
	}
	writeHosts(t, hosts, lines...)
	serveHTTP(t, appA)
	serveHTTP(t, appB)
	answerCode(t, failing, dnsmessage.RCodeServerFailure)
	answerCode(t, dropped, dnsmessage.RCodeSuccess)
	nftIn(t, dropped, "udp dport 53 drop")
	server := dnsmasq(t, ns, hosts, "--cname=alias.test.example,mid.test.example", "--cname=mid.test.example,backend.test.example")
	resolvConf(t, client, "nameserver "+ns.IPv4.String()+"\noptions timeout:2 attempts:1\n")
	at := "@" + ns.IPv4.String()
	tracertest.Eventually(t, 10*time.Second, "dnsmasq answers", func() error {
		out, err := run(t, client, "dig", "+short", "+tries=1", "+timeout=1", at, "api.test.example")
		if err != nil || !strings.Contains(out, appA.IPv4.String()) {
			return fmt.Errorf("dig: %v %s", err, out)
		}
		return nil
	})

	const timeout = time.Second
	a := startWatch(t, timeout, "")

	// getaddrinfo (curl), both families asked; dig with a CNAME chain; dig AAAA.
	mustRun(t, client, "curl", "-sS", "--max-time", "10", "http://api.test.example:8080/")
	out := mustRun(t, client, "dig", "+short", "+tries=1", at, "alias.test.example")
	if !strings.Contains(out, appB.IPv4.String()) {
		t.Fatalf("dig alias.test.example: %s", out)
	}
	dial(t, client, addr(appB.IPv4))
	out = mustRun(t, client, "dig", "+short", "+tries=1", at, "-t", "AAAA", "v6.test.example")
	if !strings.Contains(out, appB.IPv6.String()) {
		t.Fatalf("dig AAAA v6.test.example: %s", out)
	}
	dial(t, client, addr(appB.IPv6))
	// moving.test.example, then the same name pointing elsewhere once
	// its 1 s TTL ran out.
	mustRun(t, client, "dig", "+short", "+tries=1", at, "moving.test.example")
	dial(t, client, moving1)
	a.settle("the first flows", func() bool {
		_, ok1 := a.named(client, tracer.ProtoTCP, addr(appB.IPv4), 8080)
		_, ok2 := a.named(client, tracer.ProtoTCP, moving1, 8080)
		return ok1 && ok2
	})
	repointed := append([]string(nil), lines...)
	repointed[4] = moving2.String() + " moving.test.example"
	writeHosts(t, hosts, repointed...)
	if err := server.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the first answer's TTL
	tracertest.Eventually(t, 10*time.Second, "moving.test.example re-pointed", func() error {
		out, err := run(t, client, "dig", "+short", "+tries=1", at, "moving.test.example")
		if err != nil || !strings.Contains(out, moving2.String()) {
			return fmt.Errorf("dig: %v %s", err, out)
		}
		return nil
	})
	dial(t, client, moving2)

	// Failures: 3 NXDOMAIN, 2 SERVFAIL, 2 timeouts; one large answer.
	for range 3 {
		_, _ = run(t, client, "dig", "+tries=1", at, "nosuch.test.example")
	}
	for range 2 {
		_, _ = run(t, client, "dig", "+tries=1", "@"+failing.IPv4.String(), "x.test.example")
	}
	for range 2 {
		_, _ = run(t, client, "dig", "+tries=1", "+timeout=1", "@"+dropped.IPv4.String(), "x.test.example")
	}
	out = mustRun(t, client, "dig", "+tries=1", at, "big.test.example")
	if !strings.Contains(out, "Truncated, retrying in TCP mode") || strings.Count(out, "203.0.113.") != 120 {
		t.Fatalf("dig big.test.example did not retry over TCP with 120 answers:\n%s", out)
	}

	resolver := ns.IPv4.String() + ":53"
	a.settle("every lookup", func() bool {
		_, ok := a.named(client, tracer.ProtoTCP, moving2, 8080)
		return ok && a.counters(client, "dig", tracer.ProtoUDP, dropped.IPv4.String()+":53").Timeouts >= 2 &&
			a.counters(client, "dig", tracer.ProtoTCP, resolver).Answers >= 1
	})
	time.Sleep(timeout) // nothing more may come
	a.collect()

	// Names.
	for _, c := range []struct {
		addr netip.Addr
		name string
	}{
		{addr(appB.IPv4), "alias.test.example"},
		{addr(appB.IPv6), "v6.test.example"},
		{moving1, "moving.test.example"},
		{moving2, "moving.test.example"},
	} {
		if got, ok := a.named(client, tracer.ProtoTCP, c.addr, 8080); !ok || got != c.name {
			t.Errorf("flow to %s: name %q (flow seen: %v), want %q", c.addr, got, ok, c.name)
		}
	}
	curlNamed := false
	for _, ip := range []net.IP{appA.IPv4, appA.IPv6} {
		if got, ok := a.named(client, tracer.ProtoTCP, addr(ip), 8080); ok {
			curlNamed = true
			if got != "api.test.example" {
				t.Errorf("curl's flow to %s: name %q, want api.test.example", ip, got)
			}
		}
	}
	if !curlNamed {
		t.Errorf("no flow of curl to api.test.example's addresses; flows %s", a.flowList())
	}

	// Health, per client (dig) and resolver.
	check := func(what string, got, want tracer.DNSCounters) {
		t.Helper()
		if got.LatencyCount != want.LatencyCount || got.LatencyCount > 0 && (got.LatencySumUs == 0 || got.LatencyMaxUs == 0) {
			t.Errorf("%s: latency %d/%d/%d, want %d samples", what, got.LatencyCount, got.LatencySumUs, got.LatencyMaxUs, want.LatencyCount)
		}
		got.LatencySumUs, got.LatencyMaxUs = 0, 0
		if got != want {
			t.Errorf("%s:\n got  %+v\n want %+v", what, got, want)
		}
	}
	// alias, v6, moving twice (and the lookups until dnsmasq re-read its
	// file, counted from the dig runs), nosuch x3, big (truncated) over UDP.
	udp := a.counters(client, "dig", tracer.ProtoUDP, resolver)
	extra := udp.Queries - 8 // dig runs of the re-pointing wait beyond the first
	if udp.Queries < 8 {
		t.Fatalf("dig through %s: %d queries, want at least 8; %s", resolver, udp.Queries, a.dnsList())
	}
	check("dig over UDP through dnsmasq", udp, tracer.DNSCounters{Queries: 8 + extra, Answers: 8 + extra, NoError: 5 + extra, NXDomain: 3, LatencyCount: 8 + extra})
	check("dig over TCP through dnsmasq", a.counters(client, "dig", tracer.ProtoTCP, resolver), tracer.DNSCounters{Queries: 1, Answers: 1, NoError: 1, LatencyCount: 1})
	check("dig through the failing server", a.counters(client, "dig", tracer.ProtoUDP, failing.IPv4.String()+":53"), tracer.DNSCounters{Queries: 2, Answers: 2, ServFail: 2, LatencyCount: 2})
	check("dig through the dropped server", a.counters(client, "dig", tracer.ProtoUDP, dropped.IPv4.String()+":53"), tracer.DNSCounters{Queries: 2, Timeouts: 2})
	curl := a.counters(client, "curl", tracer.ProtoUDP, resolver)
	if curl.Queries < 2 || curl.Answers != curl.Queries || curl.NoError != curl.Queries {
		t.Errorf("curl (getaddrinfo) through %s: %+v; want A and AAAA asked and answered", resolver, curl)
	}
	if st := a.w.Stats(); st.Unparsed != 0 || st.Lost != 0 {
		t.Errorf("watcher stats %+v: nothing unparsed or lost expected", st)
	}
}

// nftIn loads one input rule into h's namespace.
func nftIn(t *testing.T, h *testnet.Host, rule string) {
	t.Helper()
	ruleset := fmt.Sprintf("table inet deptrace_dns_test {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\t\t%s\n\t}\n}\n", rule)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := h.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v: %s", h.Name, err, out)
	}
}

// dockerDNS is the address containers query on Docker's user-defined
// networks.
var dockerDNS = netip.MustParseAddr("127.0.0.11")

// forwarder runs a DNS forwarder in h as Docker's embedded DNS does: a
// socket on 127.0.0.11 and a port the kernel chose (returned), behind a
// NAT rule sending h's queries to 127.0.0.11:53 there; it forwards each
// query to upstream and the answer back.
func forwarder(t *testing.T, h *testnet.Host, upstream string) int {
	t.Helper()
	pc := h.ListenPacket(t, "udp4", dockerDNS.String()+":0")
	port := pc.LocalAddr().(*net.UDPAddr).Port
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := append([]byte(nil), buf[:n]...)
			go func() {
				up, err := h.Dial("udp4", upstream)
				if err != nil {
					return
				}
				defer up.Close()
				_ = up.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := up.Write(q); err != nil {
					return
				}
				ans := make([]byte, 65535)
				m, err := up.Read(ans)
				if err == nil {
					_, _ = pc.WriteTo(ans[:m], from)
				}
			}()
		}
	}()
	ruleset := fmt.Sprintf("table ip deptrace_dns_nat {\n\tchain output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tip daddr %s udp dport 53 dnat to %s:%d\n\t}\n}\n", dockerDNS, dockerDNS, port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := h.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v: %s", h.Name, err, out)
	}
	return port
}

// TestNATForwarder: a client resolving through 127.0.0.11:53, which a NAT
// rule sends to a forwarder on another port (Docker's embedded DNS, or a
// node-local cache behind a redirect): its flows carry the names, and its
// lookups count against 127.0.0.11:53, the resolver it addressed.
func TestNATForwarder(t *testing.T) {
	need(t, "dnsmasq", "dig", "curl", "nft")
	nw := testnet.New(t, 3)
	client, ns, app := nw.Hosts[0], nw.Hosts[1], nw.Hosts[2]
	hosts := filepath.Join(t.TempDir(), "hosts")
	writeHosts(t, hosts, app.IPv4.String()+" fwd.test.example", app.IPv6.String()+" fwd6.test.example")
	serveHTTP(t, app)
	dnsmasq(t, ns, hosts)
	forwarder(t, client, ns.IPv4.String()+":53")
	resolvConf(t, client, "nameserver "+dockerDNS.String()+"\noptions timeout:2 attempts:1\n")
	tracertest.Eventually(t, 10*time.Second, "the forwarder answers", func() error {
		out, err := run(t, client, "dig", "+short", "+tries=1", "+timeout=1", "@"+dockerDNS.String(), "fwd.test.example")
		if err != nil || !strings.Contains(out, app.IPv4.String()) {
			return fmt.Errorf("dig: %v %s", err, out)
		}
		return nil
	})
	a := startWatch(t, time.Second, "")
	mustRun(t, client, "curl", "-sS", "--max-time", "10", "-4", "http://fwd.test.example:8080/")
	for range 3 {
		mustRun(t, client, "dig", "+short", "+tries=1", "@"+dockerDNS.String(), "-t", "AAAA", "fwd6.test.example")
	}
	dial(t, client, addr(app.IPv6))
	// musl's resolver (Alpine images): sendto() from an unconnected
	// socket, whose datagrams reach egress with the port NAT gave them.
	const sendtoLookups = 4
	lookupWithSendto(t, client, netip.AddrPortFrom(dockerDNS, 53), "fwd.test.example", sendtoLookups)
	resolver := dockerDNS.String() + ":53"
	self := selfComm(t)
	a.settle("the client's flows and lookups", func() bool {
		_, ok1 := a.named(client, tracer.ProtoTCP, addr(app.IPv4), 8080)
		_, ok2 := a.named(client, tracer.ProtoTCP, addr(app.IPv6), 8080)
		return ok1 && ok2 && a.counters(client, "dig", tracer.ProtoUDP, resolver).Answers >= 3 &&
			a.counters(client, self, tracer.ProtoUDP, resolver).Answers >= sendtoLookups
	})
	time.Sleep(time.Second)
	a.collect()
	if got, _ := a.named(client, tracer.ProtoTCP, addr(app.IPv4), 8080); got != "fwd.test.example" {
		t.Errorf("curl's flow: name %q, want fwd.test.example; flows %s", got, a.flowList())
	}
	if got, _ := a.named(client, tracer.ProtoTCP, addr(app.IPv6), 8080); got != "fwd6.test.example" {
		t.Errorf("flow to %s: name %q, want fwd6.test.example", app.IPv6, got)
	}
	d := a.counters(client, "dig", tracer.ProtoUDP, resolver)
	d.LatencySumUs, d.LatencyMaxUs = 0, 0
	if want := (tracer.DNSCounters{Queries: 3, Answers: 3, NoError: 3, LatencyCount: 3}); d != want {
		t.Errorf("dig through %s:\n got  %+v\n want %+v\n%s", resolver, d, want, a.dnsList())
	}
	c := a.counters(client, "curl", tracer.ProtoUDP, resolver)
	if c.Queries < 1 || c.Answers != c.Queries || c.Timeouts != 0 {
		t.Errorf("curl (getaddrinfo) through %s: %+v\n%s", resolver, c, a.dnsList())
	}
	m := a.counters(client, self, tracer.ProtoUDP, resolver)
	if m.LatencyCount != sendtoLookups || m.LatencyMaxUs == 0 {
		t.Errorf("sendto() client through %s: latency of %d lookups (max %d us), want %d", resolver, m.LatencyCount, m.LatencyMaxUs, sendtoLookups)
	}
	m.LatencySumUs, m.LatencyMaxUs = 0, 0
	if want := (tracer.DNSCounters{Queries: sendtoLookups, Answers: sendtoLookups, NoError: sendtoLookups, LatencyCount: sendtoLookups}); m != want {
		t.Errorf("sendto() client through %s:\n got  %+v\n want %+v\n%s", resolver, m, want, a.dnsList())
	}

	// The per-packet variants (what trace loads before 6.3) with the
	// tracer: they read its resolver notes, their own sendmsg programs
	// not loaded, and still pair the sendto() queries NAT sent to another
	// port with their answers.
	for _, v := range dnswatch.Variants {
		if v.PerCall {
			continue
		}
		t.Run(v.Name, func(t *testing.T) {
			a, err := watch(t, time.Second, v.Name)
			if err != nil {
				// Refused with the tracer's notes: only right if it is
				// refused alone too.
				cfg := dnswatch.DefaultConfig()
				cfg.Variant = v.Name
				if alone, aerr := dnswatch.New(cfg); aerr == nil {
					_ = alone.Close() // a probe only
					t.Fatalf("variant %s loads alone but not with the tracer's resolver notes: %v", v.Name, err)
				}
				t.Logf("variant %s refused here: %v", v.Name, err)
				return
			}
			if a.w.OwnNotes() {
				t.Errorf("variant %s with the tracer loaded its own sendmsg programs", v.Name)
			}
			comm := self
			if strings.Contains(v.Lost, "no comm") {
				comm = ""
			}
			lookupWithSendto(t, client, netip.AddrPortFrom(dockerDNS, 53), "fwd.test.example", sendtoLookups)
			a.settle("the sendto() lookups", func() bool {
				return a.counters(client, comm, tracer.ProtoUDP, resolver).Answers >= sendtoLookups
			})
			time.Sleep(time.Second)
			a.collect()
			m := a.counters(client, comm, tracer.ProtoUDP, resolver)
			m.LatencySumUs, m.LatencyMaxUs = 0, 0
			if want := (tracer.DNSCounters{Queries: sendtoLookups, Answers: sendtoLookups, NoError: sendtoLookups, LatencyCount: sendtoLookups}); m != want {
				t.Errorf("%s: sendto() client through %s:\n got  %+v\n want %+v\n%s", v.Name, resolver, m, want, a.dnsList())
			}
		})
	}
}

// selfComm is this test process's name as the kernel has it.
func selfComm(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// lookupWithSendto asks server for name's A record n times, as musl's
// resolver does: from one unconnected socket, with sendto() and
// recvfrom(), each answer awaited.
func lookupWithSendto(t *testing.T, h *testnet.Host, server netip.AddrPort, name string, n int) {
	t.Helper()
	pc := h.ListenPacket(t, "udp4", ":0")
	defer pc.Close()
	buf := make([]byte, 1500)
	for i := range n {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: uint16(0x5a00 + i), RecursionDesired: true})
		_ = b.StartQuestions()
		_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		q, err := b.Finish()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pc.WriteTo(q, net.UDPAddrFromAddrPort(server)); err != nil {
			t.Fatalf("sendto %s: %v", server, err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := pc.ReadFrom(buf); err != nil {
			t.Fatalf("lookup %d of %s with sendto: %v", i, name, err)
		}
	}
}

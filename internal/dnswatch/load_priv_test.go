package dnswatch_test

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// The two tests here need nothing but the kernel (a server of their own,
// no dnsmasq): the kernel matrix can run them on every kernel.

const (
	lookupName = "svc.test.example."
	lookupNX   = "nosuch.test.example."
)

// answerLookup answers lookupName with an A record of h's own address and
// every other name with NXDOMAIN, on h's UDP port 53.
func answerLookup(t *testing.T, h *testnet.Host) {
	t.Helper()
	pc := h.ListenPacket(t, "udp4", net.JoinHostPort(h.IPv4.String(), "53"))
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := answerTo(buf[:n], h); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
}

// answerTo is the answer to query (nil for a message that is not one):
// lookupName's is an A record of h's address (whatever the type asked),
// any other name's NXDOMAIN.
func answerTo(query []byte, h *testnet.Host) []byte {
	var p dnsmessage.Parser
	hd, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	rcode := dnsmessage.RCodeNameError
	if q.Name.String() == lookupName {
		rcode = dnsmessage.RCodeSuccess
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hd.ID, Response: true, RCode: rcode, RecursionDesired: hd.RecursionDesired})
	_ = b.StartQuestions()
	_ = b.Question(q)
	if rcode == dnsmessage.RCodeSuccess {
		_ = b.StartAnswers()
		_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60},
			dnsmessage.AResource{A: [4]byte(h.IPv4.To4())})
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// lookup has a client ask lookupName and lookupNX through variant's
// watcher, and checks the one record and the name a flow to the answer's
// address gets. It returns the watcher's error when it cannot start.
func lookup(t *testing.T, variant string) error {
	nw := testnet.New(t, 2)
	client, srv := nw.Hosts[0], nw.Hosts[1]
	answerLookup(t, srv)
	cfg := dnswatch.DefaultConfig()
	cfg.Timeout = time.Second
	cfg.Variant = variant
	w, err := dnswatch.New(cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	t.Logf("variant %s (%s)", w.Variant().Name, w.Variant().Needs)
	c, err := client.Dial("udp4", net.JoinHostPort(srv.IPv4.String(), "53"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, name := range []string{lookupNX, lookupName} {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: uint16(77 + i), RecursionDesired: true})
		_ = b.StartQuestions()
		_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		q, _ := b.Finish()
		if _, err := c.Write(q); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 512)); err != nil {
			t.Fatal(err)
		}
	}
	var got []tracer.DNS
	remoteName := ""
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		iv := tracer.Interval{Time: time.Now(), Flows: []tracer.Flow{{Kind: tracer.KindFlow, NetNS: client.Inode, Proto: tracer.ProtoTCP,
			Direction: tracer.Outbound, LocalAddr: client.IPv4.String(), RemoteAddr: srv.IPv4.String(), Port: 8080}}}
		w.Apply(&iv)
		got = append(got, iv.DNS...)
		if n := iv.Flows[0].RemoteName; n != "" {
			remoteName = n
		}
		if len(got) > 0 && got[0].Answers >= 2 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if want := strings.TrimSuffix(lookupName, "."); remoteName != want {
		t.Errorf("flow to %s named %q; want %q", srv.IPv4, remoteName, want)
	}
	if len(got) != 1 {
		t.Fatalf("records %+v; want one", got)
	}
	d := got[0]
	want := tracer.DNSCounters{Queries: 2, Answers: 2, NoError: 1, NXDomain: 1, LatencyCount: 2}
	d.LatencySumUs, d.LatencyMaxUs = 0, 0
	if d.DNSCounters != want || d.NetNS != client.Inode || d.Resolver != srv.IPv4.String()+":53" || d.Proto != tracer.ProtoUDP || d.CgroupID == 0 {
		t.Errorf("record %+v; want netns %d, resolver %s:53, a cgroup, %+v", got[0], client.Inode, srv.IPv4, want)
	}
	// The process: this one, unless the variant cannot see it.
	wantPID, process := uint32(os.Getpid()), "this process"
	if w.Variant().Lost != "" {
		wantPID, process = 0, "none"
	}
	if d.PID != wantPID || (d.Comm == "") != (wantPID == 0) {
		t.Errorf("record's process %d %q; want %s (pid %d)", d.PID, d.Comm, process, wantPID)
	}
	return nil
}

// TestOneLookup: the watcher loads (the first variant the kernel
// accepts) and attaches; a lookup answered NXDOMAIN and one answered with
// an address make one record with the client's namespace, cgroup,
// process and resolver, and a flow to the address is named.
func TestOneLookup(t *testing.T) {
	if err := lookup(t, ""); err != nil {
		t.Fatalf("dns watcher: %v", err)
	}
}

// TestVariants runs the lookup with each variant the kernel loads. Each
// per-packet variant needs less of the kernel than the one before it, so
// once one loads every later one must load too; the per-call one must
// load wherever the kernel has its tracepoints.
func TestVariants(t *testing.T) {
	testnet.RequireRoot(t) // skips here, not in each variant, under make test-unit
	loaded := ""
	for _, v := range dnswatch.Variants {
		t.Run(v.Name, func(t *testing.T) {
			err := lookup(t, v.Name)
			switch {
			case err == nil:
				if loaded == "" && !v.PerCall {
					loaded = v.Name
				}
			case v.PerCall:
				refusedPerCall(t, err)
			case loaded != "":
				t.Errorf("variant %s refused where %s loads: %v", v.Name, loaded, err)
			default:
				t.Logf("variant %s refused here (needs %s): %v", v.Name, v.Needs, err)
			}
		})
	}
	if loaded == "" {
		t.Fatal("no variant loads")
	}
}

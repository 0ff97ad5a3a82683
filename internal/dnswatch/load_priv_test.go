package dnswatch_test

import (
	"net"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// TestOneLookup needs nothing but the kernel: the watcher loads and
// attaches, and a query and its answer (a server here that answers
// NXDOMAIN) make one record with the client's namespace, process and
// resolver. The kernel matrix can run it on every kernel.
func TestOneLookup(t *testing.T) {
	nw := testnet.New(t, 2)
	client, srv := nw.Hosts[0], nw.Hosts[1]
	answerCode(t, srv, dnsmessage.RCodeNameError)
	cfg := dnswatch.DefaultConfig()
	cfg.Timeout = time.Second
	w, err := dnswatch.New(cfg)
	if err != nil {
		t.Fatalf("dns watcher: %v", err)
	}
	defer w.Close()
	c, err := client.Dial("udp4", net.JoinHostPort(srv.IPv4.String(), "53"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 77, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("nosuch.test.example."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, _ := b.Finish()
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 512)); err != nil {
		t.Fatal(err)
	}
	var got []tracer.DNS
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		iv := tracer.Interval{Time: time.Now()}
		w.Apply(&iv)
		got = append(got, iv.DNS...)
		if len(got) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(got) != 1 {
		t.Fatalf("records %+v; want one", got)
	}
	d := got[0]
	want := tracer.DNSCounters{Queries: 1, Answers: 1, NXDomain: 1, LatencyCount: 1}
	d.LatencySumUs, d.LatencyMaxUs = 0, 0
	if d.DNSCounters != want || d.NetNS != client.Inode || d.Resolver != srv.IPv4.String()+":53" || d.Proto != tracer.ProtoUDP || d.Comm == "" {
		t.Errorf("record %+v; want netns %d, resolver %s:53, a process, %+v", got[0], client.Inode, srv.IPv4, want)
	}
}

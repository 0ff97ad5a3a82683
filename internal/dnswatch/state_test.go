package dnswatch

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/deptrace/deptrace/tracer"
)

var (
	clientAddr = netip.MustParseAddrPort("198.51.100.1:40000")
	resolver   = netip.MustParseAddrPort("198.51.100.2:53")
)

func query(t *testing.T, id uint16, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type rr struct {
	owner string
	cname string
	a     string
	ttl   uint32
}

func answer(t *testing.T, id uint16, name string, rcode dnsmessage.RCode, rrs ...rr) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, Response: true, RCode: rcode})
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	_ = b.StartAnswers()
	for _, r := range rrs {
		h := dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(r.owner), Class: dnsmessage.ClassINET, TTL: r.ttl}
		var err error
		switch {
		case r.cname != "":
			err = b.CNAMEResource(h, dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(r.cname)})
		case netip.MustParseAddr(r.a).Is4():
			err = b.AResource(h, dnsmessage.AResource{A: netip.MustParseAddr(r.a).As4()})
		default:
			err = b.AAAAResource(h, dnsmessage.AAAAResource{AAAA: netip.MustParseAddr(r.a).As16()})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var t0 = clock{wall: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), mono: 1_000_000_000_000}

func at(d time.Duration) clock {
	return clock{wall: t0.wall.Add(d), mono: t0.mono + uint64(d)}
}

func udpEvent(ingress bool, msg []byte, when clock) *Event {
	e := &Event{TS: when.mono, CgroupID: 7, Cookie: 42, NetNS: 1000, Ingress: ingress, Payload: msg, PayloadLen: uint32(len(msg))}
	if ingress {
		e.Src, e.Dst = resolver, clientAddr
	} else {
		e.Src, e.Dst, e.PID, e.Comm = clientAddr, resolver, 812, "curl"
	}
	return e
}

func flowTo(addr string) tracer.Flow {
	return tracer.Flow{Kind: tracer.KindFlow, NetNS: 1000, Proto: tracer.ProtoTCP, Direction: tracer.Outbound, LocalAddr: "198.51.100.1", RemoteAddr: addr, Port: 443}
}

func TestCNAMEChainNamesTheQuestion(t *testing.T) {
	s := newState(DefaultConfig())
	s.handle(udpEvent(false, query(t, 1, "www.example.com.", dnsmessage.TypeA), t0), t0)
	s.handle(udpEvent(true, answer(t, 1, "www.example.com.", dnsmessage.RCodeSuccess,
		rr{owner: "www.example.com.", cname: "edge.example.net.", ttl: 300},
		rr{owner: "edge.example.net.", cname: "x.cdn.example.org.", ttl: 60},
		rr{owner: "x.cdn.example.org.", a: "203.0.113.7", ttl: 30},
		rr{owner: "unrelated.example.", a: "203.0.113.8", ttl: 30},
	), at(3*time.Millisecond)), at(3*time.Millisecond))
	iv := tracer.Interval{Time: at(time.Second).wall, Flows: []tracer.Flow{flowTo("203.0.113.7"), flowTo("203.0.113.8")}}
	s.apply(&iv, at(time.Second))
	if iv.Flows[0].RemoteName != "www.example.com" || iv.Flows[1].RemoteName != "" {
		t.Errorf("names %q, %q; want www.example.com and none (not on the chain)", iv.Flows[0].RemoteName, iv.Flows[1].RemoteName)
	}
	if len(iv.DNS) != 1 {
		t.Fatalf("dns records %+v", iv.DNS)
	}
	d := iv.DNS[0]
	want := tracer.DNSCounters{Queries: 1, Answers: 1, NoError: 1, LatencyCount: 1, LatencySumUs: 3000, LatencyMaxUs: 3000}
	if d.DNSCounters != want || d.PID != 812 || d.Comm != "curl" || d.Resolver != "198.51.100.2:53" || d.Proto != tracer.ProtoUDP || d.CgroupID != 7 {
		t.Errorf("record %+v; want curl/812 via 198.51.100.2:53 %+v", d, want)
	}
}

func TestTTLGraceStickyAndRepointing(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Grace = 10 * time.Second
	s := newState(cfg)
	learn := func(id uint16, addr string, when clock) {
		s.handle(udpEvent(false, query(t, id, "db.example.com.", dnsmessage.TypeA), when), when)
		s.handle(udpEvent(true, answer(t, id, "db.example.com.", dnsmessage.RCodeSuccess, rr{owner: "db.example.com.", a: addr, ttl: 5}), when), when)
	}
	learn(1, "203.0.113.1", t0)
	iv := tracer.Interval{Flows: []tracer.Flow{flowTo("203.0.113.1")}}
	s.apply(&iv, at(time.Second))
	if iv.Flows[0].RemoteName != "db.example.com" {
		t.Fatalf("first flow %q", iv.Flows[0].RemoteName)
	}
	// The name moves to 203.0.113.2 after its TTL; the old connection
	// keeps its name (sticky), a new address gets it from the answer.
	learn(2, "203.0.113.2", at(20*time.Second))
	iv = tracer.Interval{Flows: []tracer.Flow{flowTo("203.0.113.1"), flowTo("203.0.113.2")}}
	s.apply(&iv, at(21*time.Second))
	if iv.Flows[0].RemoteName != "db.example.com" || iv.Flows[1].RemoteName != "db.example.com" {
		t.Errorf("after re-pointing: %q, %q", iv.Flows[0].RemoteName, iv.Flows[1].RemoteName)
	}
	// A flow to the old address never named before, past TTL and grace:
	// no name. Another namespace: no name either.
	other := flowTo("203.0.113.1")
	other.LocalAddr = "198.51.100.9"
	ns := flowTo("203.0.113.2")
	ns.NetNS = 2000
	iv = tracer.Interval{Flows: []tracer.Flow{other, ns}}
	s.apply(&iv, at(40*time.Second))
	if iv.Flows[0].RemoteName != "" || iv.Flows[1].RemoteName != "" {
		t.Errorf("expired or other namespace named: %q, %q", iv.Flows[0].RemoteName, iv.Flows[1].RemoteName)
	}
	// The old address answered for another name: that name wins over
	// the sticky one.
	s.handle(udpEvent(true, answer(t, 9, "cache.example.com.", dnsmessage.RCodeSuccess, rr{owner: "cache.example.com.", a: "203.0.113.1", ttl: 60}), at(41*time.Second)), at(41*time.Second))
	iv = tracer.Interval{Flows: []tracer.Flow{flowTo("203.0.113.1")}}
	s.apply(&iv, at(42*time.Second))
	if iv.Flows[0].RemoteName != "cache.example.com" {
		t.Errorf("reused address: %q, want cache.example.com", iv.Flows[0].RemoteName)
	}
}

func TestRcodesTimeoutsAndUnmatched(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Timeout = time.Second
	s := newState(cfg)
	for i, rc := range []dnsmessage.RCode{dnsmessage.RCodeNameError, dnsmessage.RCodeServerFailure, dnsmessage.RCodeRefused} {
		id := uint16(10 + i)
		s.handle(udpEvent(false, query(t, id, "x.example.", dnsmessage.TypeA), t0), t0)
		s.handle(udpEvent(true, answer(t, id, "x.example.", rc), at(time.Millisecond)), at(time.Millisecond))
	}
	s.handle(udpEvent(false, query(t, 20, "slow.example.", dnsmessage.TypeA), t0), t0)
	// An answer whose query was not seen: counted, attributed to no process.
	s.handle(udpEvent(true, answer(t, 99, "x.example.", dnsmessage.RCodeSuccess), t0), t0)
	s.handle(udpEvent(true, []byte{1, 2, 3}, t0), t0)
	iv := tracer.Interval{}
	s.apply(&iv, at(500*time.Millisecond))
	var curl, none tracer.DNSCounters
	for _, d := range iv.DNS {
		if d.PID == 812 {
			curl.Add(d.DNSCounters)
		} else {
			none.Add(d.DNSCounters)
		}
	}
	if curl.Queries != 4 || curl.Answers != 3 || curl.NXDomain != 1 || curl.ServFail != 1 || curl.OtherErrors != 1 || curl.Timeouts != 0 {
		t.Errorf("curl %+v", curl)
	}
	if none.Answers != 1 || none.NoError != 1 || none.Unparsed != 1 || none.LatencyCount != 0 {
		t.Errorf("unmatched %+v", none)
	}
	iv = tracer.Interval{}
	s.apply(&iv, at(2*time.Second))
	if len(iv.DNS) != 1 || iv.DNS[0].Timeouts != 1 || iv.DNS[0].Queries != 0 {
		t.Errorf("after the timeout: %+v", iv.DNS)
	}
	iv = tracer.Interval{}
	s.apply(&iv, at(3*time.Second))
	if len(iv.DNS) != 0 {
		t.Errorf("an idle interval has records: %+v", iv.DNS)
	}
}

// TCP: the answer split over segments, with a retransmitted one; a
// stream that misses bytes counts one unparsed message and nothing more.
func TestTCPReassembly(t *testing.T) {
	s := newState(DefaultConfig())
	seg := func(ingress bool, seq uint32, flags uint8, data []byte, when clock) {
		e := udpEvent(ingress, data, when)
		e.TCP, e.TCPSeq, e.TCPFlags, e.Cookie = true, seq, flags, 77
		s.handle(e, when)
	}
	framed := func(msg []byte) []byte {
		return append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)
	}
	var rrs []rr
	for i := 1; i <= 100; i++ {
		rrs = append(rrs, rr{owner: "big.example.", a: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}).String(), ttl: 60})
	}
	q := framed(query(t, 5, "big.example.", dnsmessage.TypeA))
	a := framed(answer(t, 5, "big.example.", dnsmessage.RCodeSuccess, rrs...))
	seg(false, 100, tcpSYN, nil, t0)
	seg(false, 101, 0, q[:1], t0)
	seg(false, 102, 0, q[1:], t0)
	seg(true, 5000, tcpSYN, nil, t0)
	seg(true, 5001, 0, a[:700], at(time.Millisecond))
	seg(true, 5001, 0, a[:700], at(time.Millisecond)) // retransmitted
	seg(true, 5701, 0, a[700:], at(2*time.Millisecond))
	// Another connection (the same socket's new stream) that misses
	// the middle of its answer.
	seg(false, 1, tcpSYN, nil, t0)
	q2 := framed(query(t, 6, "y.example.", dnsmessage.TypeA))
	seg(false, 2, 0, q2, t0)
	e := udpEvent(true, a[:100], t0)
	e.TCP, e.TCPSeq, e.Cookie = true, 9000, 78
	s.handle(e, t0)
	e = udpEvent(true, a[200:300], t0)
	e.TCP, e.TCPSeq, e.Cookie = true, 9200, 78
	s.handle(e, t0)
	iv := tracer.Interval{Flows: []tracer.Flow{flowTo("203.0.113.100")}}
	s.apply(&iv, at(time.Second))
	if iv.Flows[0].RemoteName != "big.example" {
		t.Errorf("name %q", iv.Flows[0].RemoteName)
	}
	var sum tracer.DNSCounters
	for _, d := range iv.DNS {
		if d.Proto != tracer.ProtoTCP {
			t.Errorf("record %+v not tcp", d)
		}
		sum.Add(d.DNSCounters)
	}
	if sum.Queries != 2 || sum.Answers != 1 || sum.NoError != 1 || sum.LatencyCount != 1 || sum.LatencySumUs != 2000 || sum.Unparsed != 1 {
		t.Errorf("tcp counters %+v", sum)
	}
	if len(s.streams) != 3 {
		t.Errorf("%d streams kept, want 3", len(s.streams))
	}
	seg(false, 200, tcpFIN, nil, t0)
	if len(s.streams) != 2 {
		t.Errorf("a FIN left %d streams, want 2", len(s.streams))
	}
}

func TestNetNSFilterAndBounds(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NetNS, cfg.MaxNames = 1000, 1
	s := newState(cfg)
	e := udpEvent(true, answer(t, 1, "a.example.", dnsmessage.RCodeSuccess, rr{owner: "a.example.", a: "203.0.113.1", ttl: 60}, rr{owner: "a.example.", a: "203.0.113.2", ttl: 60}), t0)
	s.handle(e, t0)
	other := udpEvent(true, answer(t, 2, "b.example.", dnsmessage.RCodeSuccess, rr{owner: "b.example.", a: "203.0.113.3", ttl: 60}), t0)
	other.NetNS = 2000
	s.handle(other, t0)
	if len(s.names) != 1 || s.stats.NamesDropped != 1 {
		t.Errorf("names %v dropped %d; want one kept, one dropped, the other namespace ignored", s.names, s.stats.NamesDropped)
	}
	if err := (Config{Timeout: time.Millisecond, MaxNames: 1}).Validate(); err == nil || err.Error() != "invalid --dns-timeout 1ms: allowed 100ms to 5m0s" {
		t.Errorf("validate: %v", err)
	}
}

// BenchmarkQueryAnswer: user space's work per lookup (a query and its
// answer with one A record, parsed, matched, counted and named), without
// the ring buffer read: go test -run '^$' -bench QueryAnswer ./internal/dnswatch/
func BenchmarkQueryAnswer(b *testing.B) {
	t := &testing.T{}
	s := newState(DefaultConfig())
	q := udpEvent(false, query(t, 1, "api.example.com.", dnsmessage.TypeA), t0)
	a := udpEvent(true, answer(t, 1, "api.example.com.", dnsmessage.RCodeSuccess, rr{owner: "api.example.com.", a: "203.0.113.7", ttl: 60}), t0)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := uint16(i)
		binary.BigEndian.PutUint16(q.Payload, id)
		binary.BigEndian.PutUint16(a.Payload, id)
		s.handle(q, t0)
		s.handle(a, t0)
		if i%10000 == 0 {
			s.apply(&tracer.Interval{}, t0)
		}
	}
}

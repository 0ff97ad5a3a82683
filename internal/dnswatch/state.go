package dnswatch

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/deptrace/deptrace/tracer"
)

// state is everything the watcher learns from DNS messages: the names of
// addresses per namespace, the queries waiting for an answer, TCP streams
// being reassembled and each client's counters since the last interval.
// It has no lock: the Watcher serialises its use.
type state struct {
	cfg Config
	// names maps an address in a namespace to the name asked for.
	names map[nameKey]nameEntry
	// sticky keeps the name a flow was given while its answer was valid,
	// for as long as the flow keeps being seen: a connection opened to a
	// name outlives the answer's TTL. A valid answer always wins over it.
	sticky   map[flowKey]stickyName
	pending  map[queryKey]pendingQuery
	streams  map[streamKey]*stream
	counters map[clientKey]*tracer.DNSCounters
	stats    Stats
}

// Stats are the watcher's own counters since it started.
type Stats struct {
	Events       uint64 // DNS packets or calls read from the kernel side
	Lost         uint64 // packets or calls the kernel side could not hand over (ring buffer full; per call also a record preempted by another)
	Cut          uint64 // packets or calls longer than the kernel side copies (per call, an unreadable call too)
	Unreadable   uint64 // per call: DNS calls whose buffer the kernel side could not find or trust (io_uring, sendfile, splice, a kernel thread's, a sent datagram longer or shorter than the buffer found), each counted unparsed for its client
	Skipped      uint64 // per call, attached on their own (not in the tracer's calls, whose copies against recursion cover them): program runs the kernel skipped (a preempted run on the same CPU), an upper bound of DNS calls not seen
	Unparsed     uint64 // DNS messages that could not be parsed
	NamesDropped uint64 // answers not kept: the name cache was full
	Names        int    // addresses named now
}

type nameKey struct {
	netns uint32
	addr  netip.Addr
}

type nameEntry struct {
	name    string
	expires time.Time // the answer's TTL ran out
}

type flowKey struct {
	netns         uint32
	proto         tracer.Proto
	local, remote string
	port          uint16
}

type stickyName struct {
	name string
	seen time.Time
}

type queryKey struct {
	cookie uint64
	id     uint16
	tcp    bool
}

type pendingQuery struct {
	client clientKey
	sent   uint64 // monotonic ns
}

// clientKey is one DNS record: a client (namespace, cgroup, process)
// through one resolver.
type clientKey struct {
	netns    uint32
	cgroup   uint64
	pid      uint32
	comm     string
	tcp      bool
	resolver netip.AddrPort
}

type streamKey struct {
	cookie  uint64
	ingress bool
}

// stream reassembles one direction of a DNS-over-TCP connection: each
// message is a 2-byte length and the message.
type stream struct {
	next   uint32 // sequence number of the next byte expected
	buf    []byte
	broken bool // data was missed: ignored until it closes
	seen   uint64
	// pid and comm: the process that sent the stream's first payload
	// (its query); later segments may leave in softirq, in another
	// process's context.
	pid  uint32
	comm string
}

// Limits on what the state keeps.
const (
	maxPending     = 65536
	maxStreams     = 4096
	maxStreamBytes = 2 * (65535 + 2)
	maxSticky      = 65536
	streamIdle     = 60 * time.Second
	stickyIdle     = 10 * time.Minute
)

func newState(cfg Config) *state {
	return &state{
		cfg:      cfg,
		names:    map[nameKey]nameEntry{},
		sticky:   map[flowKey]stickyName{},
		pending:  map[queryKey]pendingQuery{},
		streams:  map[streamKey]*stream{},
		counters: map[clientKey]*tracer.DNSCounters{},
	}
}

// wallOf turns a monotonic timestamp into wall-clock time, given now in
// both clocks.
type clock struct {
	wall time.Time
	mono uint64
}

func (c clock) wallOf(ns uint64) time.Time {
	return c.wall.Add(-time.Duration(int64(c.mono) - int64(ns)))
}

// handle takes one packet.
func (s *state) handle(e *Event, now clock) {
	s.stats.Events++
	if s.cfg.NetNS != 0 && e.NetNS != s.cfg.NetNS {
		return
	}
	if e.Cut() {
		s.stats.Cut++
	}
	if !e.TCP {
		if e.Cut() {
			s.unparsed(e, nil)
			return
		}
		s.message(e, e.Payload, e.PID, e.Comm, now)
		return
	}
	s.segment(e, now)
}

// segment feeds a TCP segment to its stream and handles every message it
// completes.
func (s *state) segment(e *Event, now clock) {
	k := streamKey{e.Cookie, e.Ingress}
	st := s.streams[k]
	if e.TCPFlags&(tcpFIN|tcpRST) != 0 && len(e.Payload) == 0 {
		delete(s.streams, k)
		return
	}
	if st == nil || e.TCPFlags&tcpSYN != 0 {
		if len(s.streams) >= maxStreams {
			s.pruneStreams(e.TS, true)
		}
		st = &stream{next: e.TCPSeq}
		if e.TCPFlags&tcpSYN != 0 {
			st.next = e.TCPSeq + 1
		}
		s.streams[k] = st
	}
	st.seen = e.TS
	if !e.Ingress && st.pid == 0 && e.PayloadLen > 0 {
		st.pid, st.comm = e.PID, e.Comm
	}
	defer func() {
		if e.TCPFlags&(tcpFIN|tcpRST) != 0 {
			delete(s.streams, k)
		}
	}()
	if st.broken || e.PayloadLen == 0 {
		return
	}
	data := e.Payload
	seq := e.TCPSeq
	if d := int32(st.next - seq); d > 0 { // starts before what we have: a retransmission
		if uint32(d) >= e.PayloadLen {
			return
		}
		if int(d) >= len(data) {
			data = nil
		} else {
			data = data[d:]
		}
		seq = st.next
	} else if d < 0 { // a gap: bytes were missed
		st.broken = true
		st.buf = nil
		s.unparsed(e, st)
		return
	}
	st.buf = append(st.buf, data...)
	st.next = seq + uint32(len(data))
	if e.Cut() {
		st.broken = true
		st.buf = nil
		s.unparsed(e, st)
		return
	}
	for len(st.buf) >= 2 {
		n := int(binary.BigEndian.Uint16(st.buf))
		if len(st.buf) < 2+n {
			break
		}
		s.message(e, st.buf[2:2+n], st.pid, st.comm, now)
		st.buf = st.buf[2+n:]
	}
	if len(st.buf) == 0 {
		st.buf = nil
	} else if len(st.buf) > maxStreamBytes {
		st.broken = true
		st.buf = nil
		s.unparsed(e, st)
	}
}

// client is the record a packet belongs to when no pending query names
// it: its own namespace, cgroup and process, and the resolver as the
// packet (or, on egress, the connected socket) says.
func (s *state) client(e *Event, pid uint32, comm string) clientKey {
	k := clientKey{netns: e.NetNS, cgroup: e.CgroupID, pid: pid, comm: comm, tcp: e.TCP}
	if e.Ingress {
		k.resolver = e.Src
	} else if e.SockRemote.IsValid() {
		k.resolver = e.SockRemote
	} else {
		k.resolver = e.Dst
	}
	return k
}

func (s *state) count(k clientKey) *tracer.DNSCounters {
	c := s.counters[k]
	if c == nil {
		c = &tracer.DNSCounters{}
		s.counters[k] = c
	}
	return c
}

func (s *state) unparsed(e *Event, st *stream) {
	s.stats.Unparsed++
	pid, comm := e.PID, e.Comm
	if st != nil {
		pid, comm = st.pid, st.comm
	}
	s.count(s.client(e, pid, comm)).Unparsed++
}

// message handles one DNS message: a query starts waiting for its answer;
// an answer is counted by response code against its query's client and
// its addresses named after the question.
func (s *state) message(e *Event, msg []byte, pid uint32, comm string, now clock) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		s.unparsedMsg(e, pid, comm)
		return
	}
	q, qerr := p.Question()
	if !h.Response {
		if e.Ingress {
			return // a query to a server here: not a client's
		}
		qk := queryKey{e.Cookie, h.ID, e.TCP}
		if old, ok := s.pending[qk]; ok {
			// Asked again before an answer came: the first one is lost.
			s.count(old.client).Timeouts++
		} else if len(s.pending) >= maxPending {
			s.expire(e.TS, true)
		}
		ck := s.client(e, pid, comm)
		s.count(ck).Queries++
		s.pending[qk] = pendingQuery{client: ck, sent: e.TS}
		return
	}
	if !e.Ingress {
		return // an answer a server here sends
	}
	qk := queryKey{e.Cookie, h.ID, e.TCP}
	var c *tracer.DNSCounters
	if pq, ok := s.pending[qk]; ok {
		delete(s.pending, qk)
		c = s.count(pq.client)
		if e.TS > pq.sent {
			us := (e.TS - pq.sent) / 1000
			c.LatencyCount++
			c.LatencySumUs += us
			c.LatencyMaxUs = max(c.LatencyMaxUs, us)
		}
	} else {
		// Its query was not seen (sent before the watcher started, or
		// with sendto() to an address a NAT rule redirects) or already
		// counted as timed out.
		c = s.count(s.client(e, 0, ""))
	}
	c.Answers++
	switch h.RCode {
	case dnsmessage.RCodeSuccess:
		c.NoError++
	case dnsmessage.RCodeNameError:
		c.NXDomain++
	case dnsmessage.RCodeServerFailure:
		c.ServFail++
	default:
		c.OtherErrors++
	}
	if qerr != nil {
		if qerr != dnsmessage.ErrSectionDone {
			c.Unparsed++
			s.stats.Unparsed++
		}
		return
	}
	if h.RCode != dnsmessage.RCodeSuccess || h.Truncated {
		return
	}
	if err := p.SkipAllQuestions(); err != nil {
		c.Unparsed++
		s.stats.Unparsed++
		return
	}
	if !s.answers(&p, e.NetNS, q.Name, now.wallOf(e.TS)) {
		c.Unparsed++
		s.stats.Unparsed++
	}
}

func (s *state) unparsedMsg(e *Event, pid uint32, comm string) {
	s.stats.Unparsed++
	s.count(s.client(e, pid, comm)).Unparsed++
}

// answers reads the answer section: the addresses of A and AAAA records
// whose owner is the question's name, or a name it leads to through the
// CNAME records, are named after the question. False when the section
// could not be read to its end (what was read before is kept).
func (s *state) answers(p *dnsmessage.Parser, netns uint32, qname dnsmessage.Name, at time.Time) bool {
	asked := nameString(qname)
	type addrTTL struct {
		owner string
		addr  netip.Addr
		ttl   uint32
	}
	var addrs []addrTTL
	cnames := map[string]string{} // owner -> target
	ok := true
	for range 512 {
		h, err := p.AnswerHeader()
		if err == dnsmessage.ErrSectionDone {
			break
		}
		if err != nil {
			ok = false
			break
		}
		owner := nameString(h.Name)
		switch h.Type {
		case dnsmessage.TypeA:
			r, err := p.AResource()
			if err != nil {
				ok = false
				break
			}
			addrs = append(addrs, addrTTL{owner, netip.AddrFrom4(r.A), h.TTL})
		case dnsmessage.TypeAAAA:
			r, err := p.AAAAResource()
			if err != nil {
				ok = false
				break
			}
			addrs = append(addrs, addrTTL{owner, netip.AddrFrom16(r.AAAA).Unmap(), h.TTL})
		case dnsmessage.TypeCNAME:
			r, err := p.CNAMEResource()
			if err != nil {
				ok = false
				break
			}
			cnames[owner] = nameString(r.CNAME)
		default:
			if err := p.SkipAnswer(); err != nil {
				ok = false
			}
		}
		if !ok {
			break
		}
	}
	// The names the question leads to, along the CNAME chain (bounded:
	// a loop ends it).
	reach := map[string]bool{asked: true}
	for n, i := asked, 0; i < 16; i++ {
		t, ok := cnames[n]
		if !ok || reach[t] {
			break
		}
		reach[t] = true
		n = t
	}
	for _, a := range addrs {
		if reach[a.owner] {
			s.learn(nameKey{netns, a.addr}, asked, at.Add(time.Duration(a.ttl)*time.Second))
		}
	}
	return ok
}

func nameString(n dnsmessage.Name) string {
	return strings.ToLower(strings.TrimSuffix(n.String(), "."))
}

// learn keeps addr's name; the newest answer for an address wins.
func (s *state) learn(k nameKey, name string, expires time.Time) {
	if _, ok := s.names[k]; !ok && len(s.names) >= s.cfg.MaxNames {
		s.stats.NamesDropped++
		return
	}
	s.names[k] = nameEntry{name: name, expires: expires}
}

// expire counts the queries that waited longer than the timeout as
// timeouts; all still waiting when force is set and the table is full.
func (s *state) expire(mono uint64, force bool) {
	limit := uint64(s.cfg.Timeout)
	for k, q := range s.pending {
		if mono > q.sent && mono-q.sent >= limit || force && len(s.pending) >= maxPending {
			s.count(q.client).Timeouts++
			delete(s.pending, k)
		}
	}
}

func (s *state) pruneStreams(mono uint64, force bool) {
	for k, st := range s.streams {
		if mono > st.seen && mono-st.seen >= uint64(streamIdle) || force && len(s.streams) >= maxStreams {
			delete(s.streams, k)
		}
	}
}

// name returns the name of addr in netns at time now, if an answer still
// valid (its TTL plus the grace period) named it.
func (s *state) name(netns uint32, addr netip.Addr, now time.Time) (string, bool) {
	e, ok := s.names[nameKey{netns, addr}]
	if !ok || now.After(e.expires.Add(s.cfg.Grace)) {
		return "", false
	}
	return e.name, true
}

// apply names iv's outbound tcp and udp flows, counts timed-out queries
// and moves every client's counters into iv.DNS.
func (s *state) apply(iv *tracer.Interval, now clock) {
	s.expire(now.mono, false)
	s.pruneStreams(now.mono, false)
	for i := range iv.Flows {
		f := &iv.Flows[i]
		if f.Direction != tracer.Outbound || f.IsUnix() {
			continue
		}
		fk := flowKey{f.NetNS, f.Proto, f.LocalAddr, f.RemoteAddr, f.Port}
		if n, ok := s.name(f.NetNS, f.RemoteIP().Unmap(), now.wall); ok {
			f.RemoteName = n
			if len(s.sticky) < maxSticky || s.sticky[fk].name != "" {
				s.sticky[fk] = stickyName{n, now.wall}
			}
		} else if st, ok := s.sticky[fk]; ok {
			f.RemoteName = st.name
			st.seen = now.wall
			s.sticky[fk] = st
		}
	}
	for k, st := range s.sticky {
		if now.wall.Sub(st.seen) > stickyIdle {
			delete(s.sticky, k)
		}
	}
	for k, e := range s.names {
		if now.wall.After(e.expires.Add(s.cfg.Grace)) {
			delete(s.names, k)
		}
	}
	s.stats.Names = len(s.names)
	for k, c := range s.counters {
		proto := tracer.ProtoUDP
		if k.tcp {
			proto = tracer.ProtoTCP
		}
		iv.DNS = append(iv.DNS, tracer.DNS{
			Kind: tracer.KindDNS, Time: iv.Time, NetNS: k.netns, PID: k.pid, Comm: k.comm, CgroupID: k.cgroup,
			Proto: proto, Resolver: k.resolver.String(), DNSCounters: *c,
		})
	}
	clear(s.counters)
}

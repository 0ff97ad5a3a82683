// Package stream is the streaming baseline of deptrace bench compare: the
// bundler's own programs in stream mode send every TCP connect/accept and
// every UDP datagram to user space through a ring buffer, and this package
// aggregates them there, as event-streaming tracers do.
package stream

import (
	"errors"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/deptrace/deptrace/bench/internal/baseline/perevent"
	"github.com/deptrace/deptrace/tracer"
)

// pollEvery bounds how long events wait in the ring buffer: the kernel
// side wakes the reader only when 64 KiB are pending.
const pollEvery = 50 * time.Millisecond

// Method streams events and aggregates them in user space.
type Method struct {
	b      *perevent.Bundler
	reader *ringbuf.Reader
	done   chan struct{}
	mu     sync.Mutex
	flows  map[flowKey]*tracer.Flow
}

type flowKey struct {
	netns         uint32
	proto, dir    uint8
	local, remote netip.Addr
	port          uint16
}

// New loads the bundler in stream mode and starts reading events.
func New() (*Method, error) {
	cfg := tracer.DefaultConfig()
	b, err := perevent.Load(perevent.Config{FlowMapSize: cfg.FlowMapSize, PortMapSize: cfg.PortMapSize, Mode: perevent.ModeStream})
	if err != nil {
		return nil, err
	}
	_, _ = b.Seed() // best effort: without a socket iterator only new connections are seen
	r, err := b.EventReader()
	if err != nil {
		_ = b.Close() // the reader's error is the one to report
		return nil, err
	}
	m := &Method{b: b, reader: r, done: make(chan struct{}), flows: map[flowKey]*tracer.Flow{}}
	go m.read()
	return m, nil
}

// read aggregates every event as it arrives: this per-event work in user
// space is what the method costs.
func (m *Method) read() {
	defer close(m.done)
	var rec ringbuf.Record
	m.reader.SetDeadline(time.Now().Add(pollEvery))
	for {
		if err := m.reader.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				m.reader.SetDeadline(time.Now().Add(pollEvery))
			}
			continue
		}
		e, err := perevent.DecodeEvent(rec.RawSample)
		if err != nil {
			continue
		}
		now := time.Now()
		k := flowKey{e.NetNS, e.Proto, e.Direction, e.Local, e.Remote, e.Port}
		m.mu.Lock()
		f := m.flows[k]
		if f == nil {
			proto, dir := tracer.ProtoTCP, tracer.Outbound
			if e.Proto == 17 {
				proto = tracer.ProtoUDP
			}
			if e.Direction == perevent.DirInbound {
				dir = tracer.Inbound
			}
			f = &tracer.Flow{NetNS: e.NetNS, Proto: proto, Direction: dir, Kind: tracer.KindFlow, LocalAddr: e.Local.String(), RemoteAddr: e.Remote.String(), Port: e.Port, FirstSeen: now}
			m.flows[k] = f
		}
		f.LastSeen = now
		switch e.Kind {
		case perevent.EventOpen:
			f.Connections++
		case perevent.EventFailed:
			f.FailedConnections++
		case perevent.EventUDPSend:
			f.BytesSent += uint64(e.Bytes)
		case perevent.EventUDPRecv:
			f.BytesReceived += uint64(e.Bytes)
		}
		m.mu.Unlock()
	}
}

// Name is the method's name in results.
func (m *Method) Name() string { return "streaming" }

// Collect returns the flows aggregated since the last call.
func (m *Method) Collect() ([]tracer.Flow, error) {
	m.mu.Lock()
	flows := m.flows
	m.flows = map[flowKey]*tracer.Flow{}
	m.mu.Unlock()
	now := time.Now()
	out := make([]tracer.Flow, 0, len(flows))
	for _, f := range flows {
		f.Time = now
		out = append(out, *f)
	}
	return out, nil
}

// Stats are the kernel side's counters and program statistics.
func (m *Method) Stats() (perevent.Stats, error) { return m.b.Stats() }

// Close stops reading and detaches everything.
func (m *Method) Close() error {
	m.reader.Close()
	<-m.done
	return m.b.Close()
}

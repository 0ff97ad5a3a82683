// Package fivetuple is the per-5-tuple baseline of deptrace bench compare:
// the per-call kernel side (bench/internal/baseline/perevent) aggregating in the
// kernel with the client's ephemeral port in the key, so every connection
// is an entry of its own, as per-5-tuple tracers do.
package fivetuple

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/bench/internal/baseline/perevent"
	"github.com/deptrace/deptrace/tracer"
)

// Method aggregates per 5-tuple in the kernel.
type Method struct{ b *perevent.Bundler }

// New loads the per-call kernel side in per-5-tuple mode.
func New() (*Method, error) {
	cfg := tracer.DefaultConfig()
	// One entry per connection (and per UDP client socket) each interval,
	// both ends on this host: room for the top rates.
	b, err := perevent.Load(perevent.Config{FlowMapSize: 1 << 17, PortMapSize: cfg.PortMapSize, Mode: perevent.ModeFiveTuple})
	if err != nil {
		return nil, err
	}
	_, _ = b.Seed() // best effort: without a socket iterator only new connections are seen
	return &Method{b: b}, nil
}

// Name is the method's name in results.
func (m *Method) Name() string { return "five-tuple" }

// Collect drains the entries counted since the last call.
func (m *Method) Collect() ([]tracer.Flow, error) {
	entries, err := m.b.Drain()
	now := time.Now()
	out := make([]tracer.Flow, 0, len(entries))
	for _, e := range entries {
		f := tracer.Flow{Kind: tracer.KindFlow, Time: now, NetNS: e.NetNS, Proto: tracer.ProtoTCP, Direction: tracer.Outbound,
			LocalAddr: e.Local.String(), RemoteAddr: e.Remote.String(), Port: e.Port, PID: e.PID, Comm: e.Comm,
			Counters: tracer.Counters{Connections: e.Connections, FailedConnections: e.FailedConnections,
				BytesSent: e.BytesSent, BytesReceived: e.BytesReceived},
			FirstSeen: now, LastSeen: now}
		if e.Proto == unix.IPPROTO_UDP {
			f.Proto = tracer.ProtoUDP
		}
		if e.Direction == perevent.DirInbound {
			f.Direction = tracer.Inbound
		}
		out = append(out, f)
	}
	return out, err
}

// Stats are the kernel side's counters and program statistics.
func (m *Method) Stats() (perevent.Stats, error) { return m.b.Stats() }

// Close detaches everything.
func (m *Method) Close() error { return m.b.Close() }

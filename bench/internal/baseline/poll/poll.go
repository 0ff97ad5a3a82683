// Package poll is the snapshot-polling baseline of deptrace bench compare:
// every interval it dumps the socket tables over netlink sock_diag, the way
// ss/netstat-style tools do, and reports what is connected at that instant.
// Connections that opened and closed between two polls are never seen.
package poll

import (
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/bench/internal/baseline/sockdiag"
	"github.com/deptrace/deptrace/tracer"
)

// Method polls socket snapshots.
type Method struct {
	seen map[uint64]bool // socket cookies of the previous snapshot
}

// New returns a poller; it has no kernel side.
func New() *Method { return &Method{seen: map[uint64]bool{}} }

// Name is the method's name in results.
func (m *Method) Name() string { return "polling" }

// Collect takes one snapshot. A TCP connection counts once, in the first
// snapshot that sees it; the direction comes from the listening sockets
// of the same snapshot. Only sockets a process owns count: a snapshot
// tool names the process of each dependency from the socket's inode.
func (m *Method) Collect() ([]tracer.Flow, error) {
	socks, err := sockdiag.Dump()
	if err != nil {
		return nil, err
	}
	tcpL, udpL := sockdiag.Listening(socks)
	type fk struct {
		proto, dir    string
		local, remote netip.Addr
		port          uint16
	}
	now := time.Now()
	flows := map[fk]*tracer.Flow{}
	cur := make(map[uint64]bool, len(socks))
	for _, s := range socks {
		// A socket no process owns (inode 0: TIME_WAIT, orphans) cannot
		// be attributed to a process, which is the point of dependency
		// discovery; netstat -p and ss -p show no process for them either.
		if s.Remote.Port() == 0 || s.State == sockdiag.StateListen || s.Inode == 0 {
			continue
		}
		servers := tcpL
		if s.Proto == "udp" {
			servers = udpL
		}
		k := fk{proto: s.Proto, local: s.Local.Addr(), remote: s.Remote.Addr(), dir: string(tracer.Outbound), port: s.Remote.Port()}
		if servers[s.Local.Port()] {
			k.dir, k.port = string(tracer.Inbound), s.Local.Port()
		}
		f := flows[k]
		if f == nil {
			f = &tracer.Flow{Time: now, Proto: tracer.Proto(k.proto), Direction: tracer.Direction(k.dir), Kind: tracer.KindFlow, LocalAddr: k.local.String(), RemoteAddr: k.remote.String(), Port: k.port, FirstSeen: now, LastSeen: now}
			flows[k] = f
		}
		cur[s.Cookie] = true
		if s.Proto == "tcp" && !m.seen[s.Cookie] {
			f.Connections++
		}
	}
	m.seen = cur
	out := make([]tracer.Flow, 0, len(flows))
	for _, f := range flows {
		out = append(out, *f)
	}
	return out, nil
}

// Programs: polling runs no kernel program.
func (m *Method) Programs() []*ebpf.Program { return nil }

// Losses: a snapshot cannot know what it missed.
func (m *Method) Losses() uint64 { return 0 }

// Close releases nothing.
func (m *Method) Close() error { return nil }

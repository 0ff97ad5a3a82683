package tracer

import (
	"net/netip"
	"time"
)

// Protocol and direction names as they appear in Flow.
const (
	ProtoTCP = "tcp"
	ProtoUDP = "udp"

	// Outbound: the local end is the client of the dependency.
	Outbound = "outbound"
	// Inbound: the local end is the server of the dependency.
	Inbound = "inbound"
)

// Flow is one bundled flow over one interval: every connection and
// datagram between a local address and a remote address for one server
// port, protocol and direction, whatever the client's ephemeral port was.
// It is the one record type every deptrace producer and consumer shares;
// its JSON form is documented in docs/flows.md.
type Flow struct {
	// Time is the end of the interval the counters cover.
	Time time.Time `json:"time"`
	// NetNS is the inode number of the network namespace of the local end.
	NetNS uint32 `json:"netns"`
	// Proto is "tcp" or "udp".
	Proto string `json:"proto"`
	// Direction is "outbound" (local end is the client) or "inbound".
	Direction  string     `json:"direction"`
	LocalAddr  netip.Addr `json:"local_addr"`
	RemoteAddr netip.Addr `json:"remote_addr"`
	// Port is the server port: the remote port of an outbound flow, the
	// local port of an inbound one.
	Port uint16 `json:"port"`
	// PID and Comm name the local process (thread group id and command);
	// 0 and "" when no event of the interval ran in a process.
	PID      uint32 `json:"pid"`
	Comm     string `json:"comm"`
	CgroupID uint64 `json:"cgroup_id"`
	// Connections counts TCP opens that completed; FailedConnections
	// those that did not (refused, timed out, reset during the handshake).
	Connections       uint64 `json:"connections"`
	FailedConnections uint64 `json:"failed_connections"`
	BytesSent         uint64 `json:"bytes_sent"`
	BytesReceived     uint64 `json:"bytes_received"`
	// FirstSeen and LastSeen bound the events of this interval.
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// ServerAddr is the server end of the dependency, "addr:port".
func (f Flow) ServerAddr() netip.AddrPort {
	if f.Direction == Inbound {
		return netip.AddrPortFrom(f.LocalAddr, f.Port)
	}
	return netip.AddrPortFrom(f.RemoteAddr, f.Port)
}

// ClientAddr is the client host of the dependency.
func (f Flow) ClientAddr() netip.Addr {
	if f.Direction == Inbound {
		return f.RemoteAddr
	}
	return f.LocalAddr
}

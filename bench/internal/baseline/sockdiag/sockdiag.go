// Package sockdiag snapshots the kernel's TCP and UDP socket tables over
// netlink (NETLINK_SOCK_DIAG), as ss does. The polling baseline of deptrace
// bench compare is built on it, and the streaming baseline uses it to learn
// which UDP ports are servers.
package sockdiag

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TCP states as sock_diag reports them.
const (
	StateEstablished = 1
	StateListen      = 10
	StateClose       = 7
)

// Socket is one row of the dump.
type Socket struct {
	Proto  string // "tcp" or "udp"
	State  uint8
	Local  netip.AddrPort
	Remote netip.AddrPort
	Cookie uint64
	Inode  uint32
}

// Dump returns every TCP and UDP socket, IPv4 and IPv6, of the calling
// thread's network namespace.
func Dump() ([]Socket, error) {
	var out []Socket
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		tcp, err := netlink.SocketDiagTCP(fam)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, fmt.Errorf("sock_diag tcp: %w", err)
		}
		for _, s := range tcp {
			out = append(out, convert("tcp", s))
		}
		udp, err := netlink.SocketDiagUDP(fam)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, fmt.Errorf("sock_diag udp: %w", err)
		}
		for _, s := range udp {
			out = append(out, convert("udp", s))
		}
	}
	return out, nil
}

func convert(proto string, s *netlink.Socket) Socket {
	addr := func(ip []byte, port uint16) netip.AddrPort {
		a, _ := netip.AddrFromSlice(ip)
		return netip.AddrPortFrom(a.Unmap(), port)
	}
	return Socket{
		Proto:  proto,
		State:  s.State,
		Local:  addr(s.ID.Source, s.ID.SourcePort),
		Remote: addr(s.ID.Destination, s.ID.DestinationPort),
		Cookie: uint64(s.ID.Cookie[0]) | uint64(s.ID.Cookie[1])<<32,
		Inode:  s.INode,
	}
}

// Listening returns the server ports: TCP sockets in LISTEN, and UDP
// sockets bound to a port with no peer (which is all a snapshot can tell).
func Listening(socks []Socket) (tcp, udp map[uint16]bool) {
	tcp, udp = map[uint16]bool{}, map[uint16]bool{}
	for _, s := range socks {
		switch {
		case s.Proto == "tcp" && s.State == StateListen:
			tcp[s.Local.Port()] = true
		case s.Proto == "udp" && s.Remote.Port() == 0 && s.Local.Port() != 0:
			udp[s.Local.Port()] = true
		}
	}
	return tcp, udp
}

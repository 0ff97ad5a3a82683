package dnswatch

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"unsafe"
)

// Event is one DNS packet as bpf/dns.bpf.c copied it (struct dns_event).
type Event struct {
	// TS is CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns).
	TS       uint64
	CgroupID uint64
	// Cookie is the socket's cookie: a query and its answer share it.
	Cookie uint64
	NetNS  uint32
	// PID and Comm name the sending process on egress; 0 and "" on
	// ingress (which runs in whatever process the softirq interrupted).
	PID     uint32
	Comm    string
	Ingress bool
	TCP     bool
	// TCPFlags are the TCP header's flags (FIN 1, SYN 2, RST 4).
	TCPFlags uint8
	Src, Dst netip.AddrPort
	// SockRemote is the socket's remote end when connected (what the
	// client addressed, before any NAT rule); invalid otherwise.
	SockRemote netip.AddrPort
	TCPSeq     uint32
	// PayloadLen is the transport payload's length in the packet;
	// Payload holds its first bytes (all of them unless it was longer
	// than the kernel side copies).
	PayloadLen uint32
	Payload    []byte
}

// Cut reports whether the kernel side copied less than the payload.
func (e *Event) Cut() bool { return uint32(len(e.Payload)) < e.PayloadLen }

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
)

// eventHeader is the size of struct dns_event before its payload.
var eventHeader = int(unsafe.Offsetof(dnsDnsEvent{}.Payload))

var errShortRecord = errors.New("dns record shorter than its header")

// decodeEvent reads a ring buffer record. Payload aliases raw.
func decodeEvent(raw []byte, e *Event) error {
	if len(raw) < eventHeader {
		return errShortRecord
	}
	ne := binary.NativeEndian
	var h dnsDnsEvent
	e.TS = ne.Uint64(raw[unsafe.Offsetof(h.TsNs):])
	e.CgroupID = ne.Uint64(raw[unsafe.Offsetof(h.CgroupId):])
	e.Cookie = ne.Uint64(raw[unsafe.Offsetof(h.Cookie):])
	e.NetNS = ne.Uint32(raw[unsafe.Offsetof(h.Netns):])
	e.PID = ne.Uint32(raw[unsafe.Offsetof(h.Pid):])
	comm := raw[unsafe.Offsetof(h.Comm):][:16]
	n := 0
	for n < len(comm) && comm[n] != 0 {
		n++
	}
	e.Comm = string(comm[:n])
	e.Ingress = raw[unsafe.Offsetof(h.Dir)] == uint8(dnsDnsDirDNS_INGRESS)
	e.TCP = raw[unsafe.Offsetof(h.Proto)] == 6
	family := raw[unsafe.Offsetof(h.Family)]
	e.TCPFlags = raw[unsafe.Offsetof(h.TcpFlags)]
	sport := ne.Uint16(raw[unsafe.Offsetof(h.Sport):])
	dport := ne.Uint16(raw[unsafe.Offsetof(h.Dport):])
	addr := func(off uintptr) netip.Addr {
		b := raw[off:][:16]
		if family == 4 {
			return netip.AddrFrom4([4]byte(b[:4]))
		}
		return netip.AddrFrom16([16]byte(b)).Unmap()
	}
	e.Src = netip.AddrPortFrom(addr(unsafe.Offsetof(h.Saddr)), sport)
	e.Dst = netip.AddrPortFrom(addr(unsafe.Offsetof(h.Daddr)), dport)
	e.SockRemote = netip.AddrPort{}
	if rport := ne.Uint16(raw[unsafe.Offsetof(h.SkRport):]); rport != 0 {
		if a := addr(unsafe.Offsetof(h.SkRaddr)); !a.IsUnspecified() {
			e.SockRemote = netip.AddrPortFrom(a, rport)
		}
	}
	e.TCPSeq = ne.Uint32(raw[unsafe.Offsetof(h.TcpSeq):])
	e.PayloadLen = ne.Uint32(raw[unsafe.Offsetof(h.PayloadLen):])
	capLen := int(ne.Uint32(raw[unsafe.Offsetof(h.CapLen):]))
	if capLen > len(raw)-eventHeader {
		capLen = len(raw) - eventHeader
	}
	e.Payload = raw[eventHeader : eventHeader+capLen]
	return nil
}

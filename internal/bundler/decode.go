// What the drain reads, decoded: Entry and its Counts from the flow map's
// values, the spill's slots and the flow cache's (per CPU), unix paths
// from their hashes.

package bundler

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Counts are one flow's counters, its values and slots summed (see
// struct flow_value).
type Counts struct {
	Connections       uint64
	FailedConnections uint64
	FailedRefused     uint64
	FailedTimeout     uint64
	FailedReset       uint64
	FailedUnreachable uint64
	BytesSent         uint64
	BytesReceived     uint64
	DatagramsSent     uint64
	DatagramsReceived uint64
	LatencyCount      uint64
	LatencySumUs      uint64
	LatencyMaxUs      uint64
	ResetsSent        uint64
	ResetsReceived    uint64
	Retransmits       uint64
	// TCP: the sockets' smoothed RTT, one sample per read of a socket
	// (its close, or a drain that folded its counters); min and max are 0
	// without a sample.
	RTTSamples uint64
	RTTSumUs   uint64
	RTTMinUs   uint64
	RTTMaxUs   uint64
}

// Entry is one bundled flow drained from the kernel.
type Entry struct {
	NetNS         uint32
	Proto         uint8
	Direction     uint8
	Port          uint16
	Local, Remote netip.Addr // IPv4 unmapped
	Counts
	FirstSeenBootNs uint64 // CLOCK_BOOTTIME
	LastSeenBootNs  uint64
	PID             uint32
	Comm            string
	CgroupID        uint64
	// Unix flows: the server's socket path ("@name" for an abstract one)
	// and the process at the other end, when known.
	Path     string
	PeerPID  uint32
	PeerComm string
}

// ProtoUnix is Entry.Proto of unix-domain flows.
const ProtoUnix = uint8(bundlerFlowProtoPROTO_UNIX)

// decode turns raw entries into Entries: the map's, in order, each with
// the spilled values of its key summed in, then the keys only the spill
// holds (one entry per key, however many slots it took).
func (b *Bundler) decode(keys []bundlerFlowKey, vals []bundlerFlowValue, sp spillRead) []Entry {
	spilled := make(map[bundlerFlowKey][]bundlerFlowValue, len(sp.keys))
	var spillOnly []bundlerFlowKey
	for i, k := range sp.keys {
		if _, ok := spilled[k]; !ok {
			spillOnly = append(spillOnly, k)
		}
		spilled[k] = append(spilled[k], sp.vals[i])
	}
	// Into the last committed interval's entries when they are large
	// enough: a new slice each interval (half a megabyte with 2,000 flows)
	// was garbage to collect and pages to fault in again, every drain.
	out := b.drain.spareEntries[:0]
	b.drain.spareEntries = nil
	if n := len(keys) + len(spillOnly); cap(out) < n {
		out = make([]Entry, 0, n)
	}
	for i, k := range keys {
		kv := vals[i : i+1] // one value per key: the flow maps are not per CPU
		if s, ok := spilled[k]; ok {
			kv = append(append([]bundlerFlowValue(nil), kv...), s...)
			delete(spilled, k)
		}
		out = append(out, b.entry(k, kv))
	}
	for _, k := range spillOnly {
		if s, ok := spilled[k]; ok {
			out = append(out, b.entry(k, s))
		}
	}
	b.nameServers(out)
	return out
}

// nameServers names, from the listening-port table, the TCP server flows
// no program named: the rule the programs follow (name_from_port, the
// listening process), applied where they could not, because the flow's
// connections opened and closed before its listener was in the table (a
// listener from before the start, in the moment between the programs'
// attach and the seeding that reads /proc for its process). One table
// lookup per port, not per flow.
func (b *Bundler) nameServers(entries []Entry) {
	type port struct {
		netns uint32
		port  uint16
	}
	if b.objs.Ports == nil {
		return // no kernel side (tests of decoding alone)
	}
	var seen map[port]*bundlerPortValue
	for i := range entries {
		e := &entries[i]
		if e.Proto != unix.IPPROTO_TCP || e.Direction != DirInbound || e.PID != 0 || e.Counts == (Counts{}) {
			continue
		}
		if seen == nil {
			seen = map[port]*bundlerPortValue{}
		}
		k := port{e.NetNS, e.Port}
		v, ok := seen[k]
		if !ok {
			var pv bundlerPortValue
			if err := b.objs.Ports.Lookup(&bundlerPortKey{Netns: e.NetNS, Port: e.Port, Proto: unix.IPPROTO_TCP}, &pv); err == nil && pv.Pid != 0 {
				v = &pv
			}
			seen[k] = v
		}
		if v == nil {
			continue
		}
		e.PID, e.Comm = v.Pid, commString(v.Comm)
		if v.CgroupId != 0 {
			e.CgroupID = v.CgroupId
		}
	}
}

// entry is one flow's Entry from its values (map value, spill and cache
// slots).
func (b *Bundler) entry(k bundlerFlowKey, vals []bundlerFlowValue) Entry {
	e := merge(k, vals)
	if k.Proto == ProtoUnix {
		e.Path = b.unixPath(binary.NativeEndian.Uint64(k.RemoteAddr[:8]))
		e.Local, e.Remote = netip.Addr{}, netip.Addr{}
	}
	return e
}

// pidNaming is a value's pid (or peer pid) while a program writes the
// process it names (bpf/bundler.h): no process yet. Only a salvaged side,
// whose programs may still run, can show it.
const pidNaming = uint32(bundlerPidNamingPID_NAMING)

// merge sums one flow's values: its flow map value, spill slots and
// per-CPU flow cache slots. The process is taken from the value that saw
// it last; a flow no value saw a process of keeps the cgroup one saw (a
// server's listener found at start-up whose process /proc does not show
// is known by its socket's cgroup).
func merge(k bundlerFlowKey, vals []bundlerFlowValue) Entry {
	e := Entry{
		NetNS:     k.Netns,
		Proto:     k.Proto,
		Direction: k.Direction,
		Port:      k.Port,
		Local:     netip.AddrFrom16(k.LocalAddr).Unmap(),
		Remote:    netip.AddrFrom16(k.RemoteAddr).Unmap(),
	}
	var procSeen uint64
	for _, v := range vals {
		c := &e.Counts
		c.Connections += v.Connections
		c.FailedConnections += v.FailedConnections
		c.FailedRefused += v.FailedRefused
		c.FailedTimeout += v.FailedTimeout
		c.FailedReset += v.FailedReset
		c.FailedUnreachable += v.FailedUnreachable
		c.BytesSent += v.BytesSent
		c.BytesReceived += v.BytesReceived
		c.DatagramsSent += v.DatagramsSent
		c.DatagramsReceived += v.DatagramsReceived
		c.LatencyCount += v.LatencyCount
		c.LatencySumUs += v.LatencySumUs
		c.LatencyMaxUs = max(c.LatencyMaxUs, v.LatencyMaxUs)
		c.ResetsSent += v.ResetsSent
		c.ResetsReceived += v.ResetsReceived
		c.Retransmits += v.Retransmits
		if v.RttSamples > 0 {
			if c.RTTSamples == 0 || v.RttMinUs < c.RTTMinUs {
				c.RTTMinUs = v.RttMinUs
			}
			c.RTTSamples += v.RttSamples
			c.RTTSumUs += v.RttSumUs
			c.RTTMaxUs = max(c.RTTMaxUs, v.RttMaxUs)
		}
		if v.FirstSeenNs != 0 && (e.FirstSeenBootNs == 0 || v.FirstSeenNs < e.FirstSeenBootNs) {
			e.FirstSeenBootNs = v.FirstSeenNs
		}
		if v.LastSeenNs > e.LastSeenBootNs {
			e.LastSeenBootNs = v.LastSeenNs
		}
		if v.Pid != 0 && v.Pid != pidNaming && v.LastSeenNs >= procSeen {
			procSeen = v.LastSeenNs
			e.PID = v.Pid
			e.Comm = commString(v.Comm)
			e.CgroupID = v.CgroupId
			if v.PeerPid != 0 && v.PeerPid != pidNaming {
				e.PeerPID, e.PeerComm = v.PeerPid, commString(v.PeerComm)
			}
		} else if e.PID == 0 && e.CgroupID == 0 && v.Pid != pidNaming {
			e.CgroupID = v.CgroupId
		}
	}
	return e
}

// unixPath resolves a path hash from the kernel's table, remembering
// every answer: a path never changes its hash.
func (b *Bundler) unixPath(h uint64) string {
	if p, ok := b.drain.paths[h]; ok {
		return p
	}
	var v bundlerUnixPath
	if err := b.objs.UnixPaths.Lookup(h, &v); err != nil {
		return fmt.Sprintf("unix:%016x", h) // evicted before the drain: still one stable name
	}
	n := min(int(v.Len), len(v.Path))
	raw := make([]byte, n)
	for i := range raw {
		raw[i] = byte(v.Path[i])
	}
	p := string(raw)
	if n > 0 && raw[0] == 0 {
		p = "@" + string(raw[1:]) // abstract name, as ss shows it
	} else if i := bytes.IndexByte(raw, 0); i >= 0 {
		p = string(raw[:i])
	}
	if len(b.drain.paths) > 1<<16 {
		clear(b.drain.paths)
	}
	b.drain.paths[h] = p
	return p
}

func commString(c [16]int8) string {
	b := make([]byte, 0, len(c))
	for _, ch := range c {
		if ch == 0 {
			break
		}
		b = append(b, byte(ch))
	}
	return string(b)
}

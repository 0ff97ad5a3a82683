// Package tracer embeds deptrace's in-kernel flow bundler in a Go program.
//
// A Tracer loads eBPF programs that count every TCP connection and every
// TCP/UDP send and receive into one kernel map entry per dependency (local
// address, remote address, server port, direction, protocol, network
// namespace), then hands the bundled flows to the caller once per interval.
//
// Kernel requirements: Linux with BTF (CONFIG_DEBUG_INFO_BTF=y) and the
// sock:inet_sock_set_state tracepoint (4.16+); bytes need the
// sock:sock_send_length/sock_recv_length tracepoints (6.3+); UDP bound-port
// tracking needs the bpf_rdonly_cast kfunc (6.2+); peers of unconnected UDP
// sockets need cgroup v2. Missing optional features are reported by Hooks,
// never silently. The process needs CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN and
// CAP_SYS_ADMIN (root has them).
package tracer

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/bundler"
)

// Config configures a Tracer. Start from DefaultConfig.
type Config struct {
	// Interval between two drains of the kernel map (100ms to 1h).
	Interval time.Duration
	// FlowMapSize is the most distinct bundled flows per interval.
	FlowMapSize uint32
	// PortMapSize is the most listening ports tracked.
	PortMapSize uint32
	// NetNS limits tracing to one network namespace (inode); 0 = all.
	NetNS uint32
	// FiveTuple keeps each client's ephemeral port apart: per-5-tuple
	// aggregation instead of bundling, so one connection is one record.
	// It exists as the baseline of `deptrace bench compare`; leave it off.
	FiveTuple bool
}

// Limits of Config.Interval.
const (
	MinInterval = 100 * time.Millisecond
	MaxInterval = time.Hour
)

// DefaultConfig traces every namespace with a 1 s interval.
func DefaultConfig() Config {
	return Config{Interval: time.Second, FlowMapSize: 65536, PortMapSize: 16384}
}

// Validate names the first invalid field and its allowed range.
func (c Config) Validate() error {
	if c.Interval < MinInterval || c.Interval > MaxInterval {
		return fmt.Errorf("invalid interval %s: allowed %s to %s", c.Interval, MinInterval, MaxInterval)
	}
	return c.bundlerConfig().Validate()
}

func (c Config) bundlerConfig() bundler.Config {
	bc := bundler.Config{FlowMapSize: c.FlowMapSize, PortMapSize: c.PortMapSize, NetNS: c.NetNS}
	if c.FiveTuple {
		bc.Mode = bundler.ModeFiveTuple
	}
	return bc
}

// Interval is what one drain produced.
type Interval struct {
	Time  time.Time
	Flows []Flow
	// Lost counts events lost during this interval, by cause.
	Lost Losses
}

// Losses are events the kernel side could not record.
type Losses struct {
	FlowMapFull     uint64 `json:"flow_map_full"`    // bundled-flow map full
	PortMapFull     uint64 `json:"port_map_full"`    // listening-port table full
	UDPPeerUnknown  uint64 `json:"udp_peer_unknown"` // unconnected UDP datagram, peer not seen
	UDPPeerDropped  uint64 `json:"udp_peer_dropped"` // peer table full
	RecursionMisses uint64 `json:"recursion_misses"` // program runs skipped by the kernel
}

// Total is the sum of every cause.
func (l Losses) Total() uint64 {
	return l.FlowMapFull + l.PortMapFull + l.UDPPeerUnknown + l.UDPPeerDropped + l.RecursionMisses
}

func lossesOf(s bundler.Stats) Losses {
	return Losses{
		FlowMapFull:     s.FlowInsertFailed,
		PortMapFull:     s.PortInsertFailed,
		UDPPeerUnknown:  s.UDPPeerUnknown,
		UDPPeerDropped:  s.PendingInsertFailed,
		RecursionMisses: s.RecursionMisses,
	}
}

func (l Losses) minus(o Losses) Losses {
	return Losses{
		FlowMapFull:     l.FlowMapFull - o.FlowMapFull,
		PortMapFull:     l.PortMapFull - o.PortMapFull,
		UDPPeerUnknown:  l.UDPPeerUnknown - o.UDPPeerUnknown,
		UDPPeerDropped:  l.UDPPeerDropped - o.UDPPeerDropped,
		RecursionMisses: l.RecursionMisses - o.RecursionMisses,
	}
}

// Tracer is a loaded, attached flow bundler.
type Tracer struct {
	cfg      Config
	b        *bundler.Bundler
	seed     bundler.SeedReport
	seedErr  error
	lastLoss Losses
	procs    procCache
}

// New loads and attaches the kernel programs, then seeds the listening-port
// table from the sockets that already exist. Close it when done.
func New(cfg Config) (*Tracer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b, err := bundler.Load(cfg.bundlerConfig())
	if err != nil {
		return nil, err
	}
	t := &Tracer{cfg: cfg, b: b, procs: procCache{}}
	t.seed, t.seedErr = b.Seed()
	return t, nil
}

// Close detaches every program.
func (t *Tracer) Close() error { return t.b.Close() }

// Config returns the configuration in force.
func (t *Tracer) Config() Config { return t.cfg }

// Hook is one kernel hook and whether it is active here.
type Hook = bundler.Hook

// Hooks lists every hook with its state on this kernel.
func (t *Tracer) Hooks() []Hook { return t.b.Hooks() }

// Seeded reports how many pre-existing listening ports were found, and the
// error if seeding failed (the tracer still runs; older connections may
// then get the wrong direction).
func (t *Tracer) Seeded() (namespaces, ports int, err error) {
	return t.seed.Namespaces, t.seed.Ports, t.seedErr
}

// Stats are cumulative kernel counters, for diagnostics.
type Stats = bundler.Stats

// Stats returns cumulative loss counters and per-program statistics.
func (t *Tracer) Stats() (Stats, error) { return t.b.Stats() }

// Port is one listening port known to the kernel side.
type Port = bundler.Port

// ListeningPorts lists the listening-port table.
func (t *Tracer) ListeningPorts() ([]Port, error) { return t.b.Ports() }

// BatchDrain reports whether drains use batch lookup-and-delete.
func (t *Tracer) BatchDrain() bool { return t.b.BatchSupported() }

// Collect drains the flows bundled since the previous call.
func (t *Tracer) Collect() (Interval, error) {
	entries, drainErr := t.b.Drain()
	now := time.Now()
	offset := bootToWall(now)
	iv := Interval{Time: now, Flows: make([]Flow, 0, len(entries))}
	for _, e := range entries {
		f := Flow{
			Kind:       KindFlow,
			Time:       now,
			NetNS:      e.NetNS,
			Proto:      protoName(e.Proto),
			Direction:  directionName(e.Direction),
			LocalAddr:  e.Local.String(),
			RemoteAddr: e.Remote.String(),
			Port:       e.Port,
			PID:        e.PID,
			Comm:       e.Comm,
			CgroupID:   e.CgroupID,
			Counters: Counters{
				Connections:       e.Connections,
				FailedConnections: e.FailedConnections,
				BytesSent:         e.BytesSent,
				BytesReceived:     e.BytesReceived,
			},
			FirstSeen: time.Unix(0, int64(e.FirstSeenBootNs)+offset),
			LastSeen:  time.Unix(0, int64(e.LastSeenBootNs)+offset),
		}
		// An entry created only to name the process of a connect() still
		// in progress carries no counts: it is not a flow yet.
		if f.Connections == 0 && f.FailedConnections == 0 && f.BytesSent == 0 && f.BytesReceived == 0 {
			t.procs.remember(f)
			continue
		}
		t.procs.fill(&f)
		iv.Flows = append(iv.Flows, f)
	}
	stats, err := t.b.Stats()
	if err == nil {
		cur := lossesOf(stats)
		iv.Lost = cur.minus(t.lastLoss)
		t.lastLoss = cur
	}
	if drainErr != nil {
		return iv, drainErr
	}
	return iv, err
}

// Run drains every interval and calls emit with the result until ctx is
// done; then it drains once more so the last partial interval is not lost.
func (t *Tracer) Run(ctx context.Context, emit func(Interval) error) error {
	tick := time.NewTicker(t.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			iv, err := t.Collect()
			if emitErr := emit(iv); err == nil {
				err = emitErr
			}
			return err
		case <-tick.C:
			iv, err := t.Collect()
			if err != nil {
				return err
			}
			if err := emit(iv); err != nil {
				return err
			}
		}
	}
}

// bootToWall returns wall-clock ns minus CLOCK_BOOTTIME ns, the offset that
// turns kernel timestamps (bpf_ktime_get_boot_ns) into wall-clock time.
func bootToWall(now time.Time) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return now.UnixNano() - ts.Nano()
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return ProtoTCP
	case unix.IPPROTO_UDP:
		return ProtoUDP
	}
	return fmt.Sprintf("proto%d", p)
}

func directionName(d uint8) string {
	if d == bundler.DirInbound {
		return Inbound
	}
	return Outbound
}

// procCache remembers the process last seen on each flow, so that a flow
// whose interval held only softirq events (a connect() completing or
// failing after the interval in which it started) is still named.
type procCache map[procKey]procInfo

type procKey struct {
	netns  uint32
	proto  string
	dir    string
	local  string
	remote string
	port   uint16
}

type procInfo struct {
	pid    uint32
	comm   string
	cgroup uint64
}

const procCacheMax = 1 << 16

func keyOf(f Flow) procKey {
	return procKey{f.NetNS, f.Proto, f.Direction, f.LocalAddr, f.RemoteAddr, f.Port}
}

func (c procCache) remember(f Flow) {
	if f.PID == 0 {
		return
	}
	if len(c) >= procCacheMax {
		clear(c) // bounded memory beats a perfect cache
	}
	c[keyOf(f)] = procInfo{f.PID, f.Comm, f.CgroupID}
}

func (c procCache) fill(f *Flow) {
	if f.PID != 0 {
		c.remember(*f)
		return
	}
	if p, ok := c[keyOf(*f)]; ok {
		f.PID, f.Comm, f.CgroupID = p.pid, p.comm, p.cgroup
	}
}

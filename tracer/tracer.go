// Package tracer embeds deptrace's in-kernel flow bundler in a Go program.
//
// A Tracer loads eBPF programs that count every TCP connection and every
// UDP datagram into one kernel map entry per dependency (local address,
// remote address, server port, direction, protocol, network namespace),
// then hands the bundled flows to the caller once per interval. TCP bytes
// and retransmissions are read from the kernel's own per-socket counters
// (at every drain for live connections, and at close), so TCP sends and
// receives run no deptrace code.
//
// Kernel requirements: Linux with BTF (CONFIG_DEBUG_INFO_BTF=y), the
// sock:inet_sock_set_state tracepoint and the socket-storage map iterator
// (5.9+), BPF atomics (5.12+); UDP datagrams need the
// sock:sock_send_length/sock_recv_length tracepoints (6.3+); peers of
// unconnected UDP sockets need cgroup v2. Missing optional features are
// reported by Hooks, never silently. The process needs CAP_BPF,
// CAP_PERFMON, CAP_NET_ADMIN and CAP_SYS_ADMIN (root has them).
package tracer

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/bundler"
	"github.com/deptrace/deptrace/internal/netns"
)

// Config configures a Tracer. Start from DefaultConfig.
type Config struct {
	// Interval between two drains of the kernel map (100ms to 1h).
	Interval time.Duration
	// FlowMapSize is the most distinct bundled flows per interval.
	FlowMapSize uint32
	// PortMapSize is the most TCP listening ports tracked.
	PortMapSize uint32
	// NetNS limits tracing to one network namespace (inode); 0 = all.
	NetNS uint32
	// PinPath, when set (e.g. DefaultPinPath), pins the kernel side on
	// bpffs so it keeps counting if this process dies, and adopts the one
	// a previous process left there: nothing counted meanwhile is lost.
	// One process at a time owns a pin path.
	PinPath string
	// SyscallTracepoints allows the connect system call's exit tracepoint
	// on kernels without fexit, for failed unix connects and TCP connects
	// rejected before any SYN. Off by default: while it is attached, every
	// system call of every process takes the kernel's slower exit path
	// (about 50 ns more per call on this project's VM).
	SyscallTracepoints bool
}

// DefaultPinPath is where deptrace agent pins its kernel side.
const DefaultPinPath = "/sys/fs/bpf/deptrace"

// Limits of Config values.
const (
	MinInterval    = 100 * time.Millisecond
	MaxInterval    = time.Hour
	MinMapSize     = bundler.MinMapSize
	MaxFlowMapSize = bundler.MaxFlowMapSize
	MaxPortMapSize = bundler.MaxPortMapSize
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
	return bundler.Config{FlowMapSize: c.FlowMapSize, PortMapSize: c.PortMapSize, NetNS: c.NetNS, PinPath: c.PinPath, SyscallTracepoints: c.SyscallTracepoints, SeedFollows: true}
}

// Interval is what one drain produced.
type Interval struct {
	Time      time.Time
	Flows     []Flow
	Listeners []Listener
	// DNS holds each client's lookups over the interval. The Tracer
	// leaves it empty; deptrace's DNS watcher fills it (and each outbound
	// flow's RemoteName) before the interval is written or stored.
	DNS []DNS
	// Drain is how long the drain that ended the interval took.
	Drain time.Duration
	// Lost counts what the kernel side could not record this interval.
	Lost Losses
	// BatchID names the interval's counts uniquely, across processes and
	// machines: the kernel side's random identity and the interval's
	// number on it. With Config.PinPath, an interval that was collected
	// but not committed (the process died, or did not call Commit) is
	// collected again with the same BatchID: store intervals so that a
	// BatchID applied once is ignored after, and nothing counts twice.
	// "" when the drain failed before any flow was read.
	BatchID string
	// Recovered: this interval was collected before, by this process or
	// by one that died, and not committed; it is that interval again.
	// Its Listeners are empty (they belong to the next interval).
	Recovered bool

	commit  func() error
	abandon func()
}

// Commit tells the tracer that the interval is stored durably. With
// Config.PinPath, the interval's counts stay in the pinned kernel side
// until Commit, so that a process that dies before storing them loses
// nothing: the next one collects them again (same BatchID). Without
// PinPath the interval is committed when Collect returns and Commit does
// nothing. Committing twice, or an interval committed already, does
// nothing. Commit may be called from another goroutine than Collect. In
// RunWith's AsyncCommit mode it also lets the next drain go.
func (iv Interval) Commit() error {
	if iv.commit == nil {
		return nil
	}
	return iv.commit()
}

// Abandon tells RunWith (in AsyncCommit mode) that the interval could
// not be stored: it stays uncommitted, so with Config.PinPath the kernel
// side keeps it and the next drain collects it again (Recovered, same
// BatchID). Outside AsyncCommit mode it does nothing.
func (iv Interval) Abandon() {
	if iv.abandon != nil {
		iv.abandon()
	}
}

// Losses are counts the kernel side could not record, by cause. The same
// type is used per interval and cumulatively.
type Losses struct {
	FlowMapFull       uint64 `json:"flow_map_full"`       // bundled-flow map full
	FlowAllocFailed   uint64 `json:"flow_alloc_failed"`   // a flow entry could not be allocated
	PortMapFull       uint64 `json:"port_map_full"`       // listening-port table full
	UDPPeerUnknown    uint64 `json:"udp_peer_unknown"`    // unconnected UDP datagram, peer not seen
	SockStorageFailed uint64 `json:"sock_storage_failed"` // a socket could not be tagged: its counts lost
	RecursionMisses   uint64 `json:"recursion_misses"`    // program runs skipped by the kernel, not done by a copy
}

// Total is the sum of every cause.
func (l Losses) Total() uint64 {
	return l.FlowMapFull + l.FlowAllocFailed + l.PortMapFull + l.UDPPeerUnknown + l.SockStorageFailed + l.RecursionMisses
}

func lossesOf(s bundler.Stats) Losses {
	return Losses{
		FlowMapFull:       s.FlowMapFull,
		FlowAllocFailed:   s.FlowAllocFailed,
		PortMapFull:       s.PortMapFull,
		UDPPeerUnknown:    s.UDPPeerUnknown,
		SockStorageFailed: s.SockStorageFailed,
		RecursionMisses:   s.RecursionMisses,
	}
}

func (l Losses) minus(o Losses) Losses {
	return Losses{
		FlowMapFull:       l.FlowMapFull - o.FlowMapFull,
		FlowAllocFailed:   l.FlowAllocFailed - o.FlowAllocFailed,
		PortMapFull:       l.PortMapFull - o.PortMapFull,
		UDPPeerUnknown:    l.UDPPeerUnknown - o.UDPPeerUnknown,
		SockStorageFailed: l.SockStorageFailed - o.SockStorageFailed,
		// The only one that can shrink: a skipped run read between its
		// miss and its rescue by a copy (bundler.recursionLost).
		RecursionMisses: l.RecursionMisses - min(o.RecursionMisses, l.RecursionMisses),
	}
}

// Tracer is a loaded, attached flow bundler.
type Tracer struct {
	cfg      Config
	mu       sync.Mutex // Collect and Commit
	b        *bundler.Bundler
	seed     bundler.SeedReport
	seedErr  error
	lastLoss Losses
	procs    procCache
	routes   *sourceCache
	addrs    addrNames
	// spareFlows: an interval's flows handed back (RunOptions.ReuseFlows),
	// for the next Collect to build its flows in.
	spareFlows []Flow
}

// New loads and attaches the kernel programs, then takes in the sockets
// that already exist (listening ports, open connections). Close it when
// done.
func New(cfg Config) (*Tracer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b, err := bundler.Load(cfg.bundlerConfig())
	if err != nil {
		var rh *bundler.RequiredHookError
		if errors.As(err, &rh) {
			return nil, &RequiredHookError{Hook: Hook(rh.Hook)}
		}
		return nil, err
	}
	t := &Tracer{cfg: cfg, b: b, procs: procCache{}, routes: newSourceCache(), addrs: addrNames{}}
	// An adopted kernel side has its sockets tagged already; a fresh one
	// is pinned (with Config.PinPath) once seeded.
	if !b.Adoption().Adopted {
		t.seed, t.seedErr = b.Seed()
		if err := b.PinSeeded(); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Close detaches every program and removes the pins, if any.
func (t *Tracer) Close() error { return t.b.Close() }

// Release ends this process's use of a pinned kernel side but leaves it
// attached and counting, for the next process with the same PinPath to
// adopt; an interval collected and not committed is collected again
// there (Interval.Recovered). Without PinPath it is Close.
func (t *Tracer) Release() {
	if t.cfg.PinPath == "" {
		_ = t.b.Close() // Release has no error to return
		return
	}
	t.b.Release()
}

// Adoption says what New found at Config.PinPath.
type Adoption struct {
	// Adopted: a kernel side left by a previous process was taken over;
	// what it counted since comes with the next Collects. If that process
	// collected an interval and did not commit it, the first Collect
	// returns it again (Interval.Recovered, the same BatchID).
	Adopted bool
	// Replaced says why a pinned kernel side was removed instead (another
	// deptrace build, other map sizes); "" if none was.
	Replaced string
	// Salvaged flows were read from the replaced side: reported in the
	// first Collects (the interval its process collected and did not
	// commit, if any, first, under its own BatchID and Recovered; then
	// what it counted since, with this side's first interval). Unreadable
	// entries were lost with it.
	Salvaged, Unreadable int
	// MountedBPFFS: bpffs was not mounted at the pin path's parent, and
	// New mounted it.
	MountedBPFFS bool
}

// Adoption reports what New found at Config.PinPath.
func (t *Tracer) Adoption() Adoption {
	a := t.b.Adoption()
	return Adoption{Adopted: a.Adopted, Replaced: a.Replaced, Salvaged: len(a.Salvaged) + len(a.SalvagedPending), Unreadable: a.Unreadable, MountedBPFFS: a.MountedBPFFS}
}

// Cleanup removes a kernel side left pinned at pinPath (by a process that
// was killed or released it). It refuses while a process owns it.
func Cleanup(pinPath string) (found bool, err error) { return bundler.Cleanup(pinPath) }

// CheckPinPath says why pinPath cannot hold a pinned kernel side (not
// absolute, not on bpffs), without creating anything.
func CheckPinPath(pinPath string) error { return bundler.CheckPinPath(pinPath) }

// Config returns the configuration in force.
func (t *Tracer) Config() Config { return t.cfg }

// DNSCallHooks returns where the DNS watcher puts its per-call programs:
// the program arrays the tracer's send and receive programs hand a call on
// a possible resolver's socket to (ok is false on kernels before 6.3,
// whose sends and receives are counted at function exits); and the
// resolver notes its sendmsg programs write (dests, nil where they are
// not attached), which any of the watcher's variants reads in place of
// notes of its own (internal/dnswatch, Config.Calls). The maps stay the
// tracer's: they close with it.
func (t *Tracer) DNSCallHooks() (send, recv, dests *ebpf.Map, ok bool) { return t.b.DNSCallHooks() }

// Hook is one kernel hook and whether it is active on this kernel.
type Hook struct {
	Program  string
	Hook     string // attach point, e.g. tp_btf/inet_sock_set_state
	Active   bool
	Required bool
	Provides string // what users lose without it
	Reason   string // why it is inactive, one line
	Log      string // the verifier's full log when it rejected the program
	// Standby: a fallback hook not loaded because what it replaces runs
	// on this kernel.
	Standby bool
	// Replaces names the programs a fallback hook stands in for, where
	// they are missing, separated by commas ("" for primary hooks).
	Replaces string
	// Off: not loaded because the configuration leaves it off (Reason
	// names the option).
	Off bool
	// Copies of the program attached after it, which recover the runs
	// the kernel skips for recursion (docs/design.md); CopiesMissing says
	// why a program that should have them runs alone.
	Copies        []string
	CopiesMissing string
}

// RequiredHookError is returned by New when a hook deptrace cannot run
// without is unavailable on this kernel; Hook.Log holds the verifier log.
type RequiredHookError struct{ Hook Hook }

func (e *RequiredHookError) Error() string {
	return fmt.Sprintf("required hook %s is unavailable: %s", e.Hook.Hook, e.Hook.Reason)
}

// Hooks lists every hook with its state on this kernel.
func (t *Tracer) Hooks() []Hook {
	var out []Hook
	for _, h := range t.b.Hooks() {
		out = append(out, Hook(h))
	}
	return out
}

// Seeded reports how many namespaces and pre-existing listening ports were
// found, and the error if seeding failed (the tracer still runs; older
// connections may then get the wrong direction).
func (t *Tracer) Seeded() (namespaces, ports int, err error) {
	return t.seed.Namespaces, t.seed.Ports, t.seedErr
}

// Stats are cumulative kernel-side counters, for diagnostics.
type Stats struct {
	Lost Losses
	// RecursionRecovered: runs the kernel skipped for recursion that a
	// later copy of the program did instead (not losses).
	RecursionRecovered uint64
	// Programs holds each program's run count and run time; they grow only
	// while kernel.bpf_stats_enabled is on.
	Programs map[string]ProgramStats
}

// ProgramStats are one kernel program's statistics.
type ProgramStats struct {
	RunCount        uint64
	RunTime         time.Duration
	RecursionMisses uint64
}

// Stats returns cumulative loss counters and per-program statistics.
func (t *Tracer) Stats() (Stats, error) {
	s, err := t.b.Stats()
	out := Stats{Lost: lossesOf(s), RecursionRecovered: s.RecursionRecovered, Programs: map[string]ProgramStats{}}
	for n, p := range s.Programs {
		out.Programs[n] = ProgramStats(p)
	}
	return out, err
}

// Port is one TCP listening port known to the kernel side.
type Port struct {
	NetNS uint32
	Proto Proto
	Port  uint16
	Refs  uint32 // listening sockets on the port
	PID   uint32 // the process that last started listening; 0 if unknown
	Comm  string
}

// ListeningPorts lists the listening-port table.
func (t *Tracer) ListeningPorts() ([]Port, error) {
	ports, err := t.b.Ports()
	out := make([]Port, len(ports))
	for i, p := range ports {
		out[i] = Port{NetNS: p.NetNS, Proto: protoName(p.Proto), Port: p.Port, Refs: p.Refs, PID: p.PID, Comm: p.Comm}
	}
	return out, err
}

// Collect ends an interval: it harvests live sockets, drains the flows
// bundled since the previous call and reports every listener.
//
// Without Config.PinPath the interval is committed when Collect returns
// it. With it, call Interval.Commit once the interval is stored: until
// then Collect returns that same interval again (Recovered, same BatchID)
// rather than a new one, and the kernel side keeps counting meanwhile. A
// process that adopts a pinned kernel side gets, in its first Collect, the
// interval a previous process collected but never committed, if any; one
// that replaces an incompatible side (Adoption.Replaced) gets that side's
// such interval salvaged, under its batch id, until it is committed.
//
// Flows that could not be read whole are not returned at all (the interval
// has no BatchID, and the error says why): the next Collect reads them
// again and returns them (Recovered), so an interval is always whole.
func (t *Tracer) Collect() (Interval, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	start := time.Now()
	d, drainErr := t.b.Collect()
	entries, listeners := d.Entries, d.Listeners
	now := time.Now()
	offset := bootToWall(now)
	flows := flowsFor(t.spareFlows, len(entries))
	t.spareFlows = nil
	iv := Interval{Time: now, Flows: flows, Drain: now.Sub(start), BatchID: d.BatchID(), Recovered: d.Recovered}
	if side, gen := d.Side, d.Gen; gen != 0 {
		iv.commit = func() error {
			t.mu.Lock()
			defer t.mu.Unlock()
			return t.b.CommitOf(side, gen)
		}
	}
	iv.Flows = t.flowsOf(entries, now, offset, iv.Flows)
	for _, l := range listeners {
		iv.Listeners = append(iv.Listeners, Listener{Kind: KindListener, Time: now, NetNS: l.NetNS, Proto: ProtoTCP,
			LocalAddr: l.Local.String(), Port: l.Port, PID: l.PID, Comm: l.Comm,
			BacklogLimit: l.BacklogLimit, QueueMax: queueMax(l), Drops: l.Drops})
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

// flowsFor is an empty slice for n flows: spare, an interval's flows handed
// back (RunOptions.ReuseFlows), when it is large enough, unless a burst
// left it much larger than needed (a hostile interval's size is not kept).
func flowsFor(spare []Flow, n int) []Flow {
	if cap(spare) < n || cap(spare) > 2*n+1024 {
		return make([]Flow, 0, n)
	}
	return spare[:0]
}

// reuseFlows takes an emitted interval's flows back for the next Collect
// (RunOptions.ReuseFlows).
func (t *Tracer) reuseFlows(flows []Flow) {
	t.mu.Lock()
	t.spareFlows = flows
	t.mu.Unlock()
}

// flowsOf appends the flows of a drain's entries to flows, named: the
// text of their addresses, and the process from procs where the interval
// saw none; entries that naming makes one dependency become one flow.
func (t *Tracer) flowsOf(entries []bundler.Entry, now time.Time, offset int64, flows []Flow) []Flow {
	start, merge := len(flows), false
	var netnsOfPID map[uint32]uint32 // this drain's reads of /proc/PID/ns/net
	for i := range entries {
		e := &entries[i]
		if e.Counts == (bundler.Counts{}) {
			continue // a retained entry whose flow was idle: nothing to name
		}
		f := Flow{
			Kind:       KindFlow,
			Time:       now,
			NetNS:      e.NetNS,
			Proto:      protoName(e.Proto),
			Direction:  directionName(e.Direction),
			LocalAddr:  t.addrs.name(e.Local),
			RemoteAddr: t.addrs.name(e.Remote),
			Port:       e.Port,
			PID:        e.PID,
			Comm:       e.Comm,
			CgroupID:   e.CgroupID,
			Counters:   countersOf(e.Counts),
			FirstSeen:  time.Unix(0, int64(e.FirstSeenBootNs)+offset),
			LastSeen:   time.Unix(0, int64(e.LastSeenBootNs)+offset),
		}
		local := e.Local
		if e.Proto == bundler.ProtoUnix {
			f.LocalAddr, f.RemoteAddr = "", e.Path
			if f.Direction == Inbound {
				f.LocalAddr, f.RemoteAddr = e.Path, ""
			}
			f.PeerPID, f.PeerComm = e.PeerPID, e.PeerComm
		}
		if f.Proto == ProtoUDP && e.Local.IsUnspecified() {
			// An unconnected socket bound to a wildcard: the kernel picks
			// the source per datagram by routing; ask the same routing.
			if src, ok := t.routes.source(e.NetNS, e.Remote); ok {
				local = src
				f.LocalAddr = t.addrs.name(src)
				merge = true
			}
		}
		t.procs.fill(&f, procKey{netns: e.NetNS, proto: e.Proto, dir: e.Direction, port: e.Port, local: local, remote: e.Remote, path: e.Path})
		if f.Proto == ProtoUnix && f.Direction == Inbound && f.PID != 0 {
			if netnsOfPID == nil {
				netnsOfPID = map[uint32]uint32{}
			}
			merge = unixServerNetNS(&f, netnsOfPID) || merge
		}
		flows = append(flows, f)
	}
	if merge {
		// A routed source, or a unix server's own namespace, can make a
		// flow the same as another entry's (mergeSameFlows); only then.
		flows = flows[:start+len(mergeSameFlows(flows[start:]))]
	}
	return flows
}

// unixServerNetNS puts the server end of a unix connection in its
// server's network namespace, and reports whether it moved it. The kernel
// creates the socket a unix stream server accepts in the namespace of the
// socket that connected (unix_stream_connect: sock_net of the client's),
// so the server's flow carries the client's namespace, and a server in
// one container would show in its client's. The namespace of the process
// that used the socket (/proc/PID/ns/net) is the server's; a process gone
// since leaves the kernel's (a pid reused in between, within one
// interval, would move it wrongly: rare, and only the NETNS shown). The
// agent files unix flows with a path under the machine's host anyway
// (internal/agent: flowNetNS); trace's NETNS and jsonl's netns show it.
// Datagram servers' sockets are their own: no move.
func unixServerNetNS(f *Flow, netnsOfPID map[uint32]uint32) bool {
	ino, ok := netnsOfPID[f.PID]
	if !ok {
		ino, _ = netns.Inode(fmt.Sprintf("/proc/%d/ns/net", f.PID)) // 0 when gone: kept
		netnsOfPID[f.PID] = ino
	}
	if ino == 0 || ino == f.NetNS {
		return false
	}
	f.NetNS = ino
	return true
}

// queueMax is the deepest accept queue the interval had: the kernel side
// reads the queue each time a connection joins it, and the queue at the
// drain and a full backlog (drops) bound it from below.
func queueMax(l bundler.Listener) uint32 {
	q := max(l.Queue, l.QueueMax)
	if l.Drops > 0 {
		// Dropping means the queue was full, whether or not a connection
		// joined it while it was.
		q = max(q, l.BacklogLimit)
	}
	return q
}

func countersOf(c bundler.Counts) Counters {
	return Counters{
		Connections:         c.Connections,
		FailedConnections:   c.FailedConnections,
		FailedRefused:       c.FailedRefused,
		FailedTimeout:       c.FailedTimeout,
		FailedReset:         c.FailedReset,
		FailedUnreachable:   c.FailedUnreachable,
		BytesSent:           c.BytesSent,
		BytesReceived:       c.BytesReceived,
		DatagramsSent:       c.DatagramsSent,
		DatagramsReceived:   c.DatagramsReceived,
		ConnectLatencyCount: c.LatencyCount,
		ConnectLatencySumUs: c.LatencySumUs,
		ConnectLatencyMaxUs: c.LatencyMaxUs,
		ResetsSent:          c.ResetsSent,
		ResetsReceived:      c.ResetsReceived,
		Retransmits:         c.Retransmits,
		RTTSamples:          c.RTTSamples,
		RTTSumUs:            c.RTTSumUs,
		RTTMinUs:            c.RTTMinUs,
		RTTMaxUs:            c.RTTMaxUs,
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

func protoName(p uint8) Proto {
	switch p {
	case unix.IPPROTO_TCP:
		return ProtoTCP
	case unix.IPPROTO_UDP:
		return ProtoUDP
	case bundler.ProtoUnix:
		return ProtoUnix
	}
	return Proto(fmt.Sprintf("proto%d", p))
}

func directionName(d uint8) Direction {
	if d == bundler.DirInbound {
		return Inbound
	}
	return Outbound
}

// addrNames remembers the text of the addresses flows had lately: a flow
// recurs every interval, and one string per address, shared by its
// intervals, spares an allocation per flow and end (and the garbage) and
// makes the agent's maps keyed by address compare equal strings by
// pointer.
type addrNames map[netip.Addr]string

const addrNamesMax = 1 << 16

func (c addrNames) name(a netip.Addr) string {
	if s, ok := c[a]; ok {
		return s
	}
	if len(c) >= addrNamesMax {
		clear(c) // bounded memory beats a perfect cache
	}
	s := a.String()
	c[a] = s
	return s
}

// procCache remembers the process last seen on each flow, so that a flow
// whose interval held only softirq events (a connect() completing or
// failing after the interval in which it started) is still named.
type procCache map[procKey]procInfo

type procKey struct {
	netns      uint32
	proto, dir uint8 // as the kernel map has them
	port       uint16
	// local is a wildcard-bound udp socket's routed source, as in
	// Flow.LocalAddr; otherwise the kernel map's.
	local, remote netip.Addr
	path          string // unix flows: the server's socket path
}

type procInfo struct {
	pid    uint32
	comm   string
	cgroup uint64
}

const procCacheMax = 1 << 16

// fill names f from the cache where its interval did not: the process
// when it has none, and the cgroup when it has none and the process is
// the one cached (a listener from before the start can come with its
// cgroup and no process). Then it remembers f's process: a flow that
// recurs with the same process hashes its key once. k is f's key in the
// kernel map's terms, not f's text: hashing four strings per flow made
// naming a drain of 2,000 flows about 17 % slower (medians of
// BenchmarkFlowsOf2000Entries).
func (c procCache) fill(f *Flow, k procKey) {
	p, ok := c[k]
	if ok {
		if f.PID == 0 {
			f.PID, f.Comm = p.pid, p.comm
		}
		if f.CgroupID == 0 && f.PID == p.pid {
			f.CgroupID = p.cgroup
		}
	}
	seen := procInfo{f.PID, f.Comm, f.CgroupID}
	if (f.PID == 0 && f.CgroupID == 0) || (ok && p == seen) {
		return
	}
	if len(c) >= procCacheMax {
		clear(c) // bounded memory beats a perfect cache
	}
	c[k] = seen
}

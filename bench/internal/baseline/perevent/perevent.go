package perevent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/bundler"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/netns"
)

// Directions as the kernel program writes them.
const (
	DirOutbound = 1 // the local end is the client
	DirInbound  = 2 // the local end is the server
)

// Config sizes the kernel maps and picks the namespaces to trace.
type Config struct {
	// FlowMapSize is the most distinct bundled flows one interval holds.
	// Past it, events are lost and counted (Stats.FlowInsertFailed).
	FlowMapSize uint32
	// PortMapSize is the most listening ports tracked across namespaces.
	PortMapSize uint32
	// NetNS limits tracing to one network namespace (inode); 0 traces all.
	NetNS uint32
	// Mode is ModeBundle for deptrace. ModeFiveTuple and ModeStream are
	// the baselines deptrace bench compare measures bundling against, on
	// the same hooks: per-5-tuple aggregation, and streaming events.
	Mode Mode
}

// Mode selects how the kernel side aggregates.
type Mode uint8

// Modes, as bundler.h defines them.
const (
	ModeBundle    Mode = 0
	ModeFiveTuple Mode = 1
	ModeStream    Mode = 2
)

// streamRingSize is the ring buffer of stream mode; other modes get the
// minimum, one page.
const streamRingSize = 16 << 20

// Validate checks every field and names the allowed range. The limits
// and the check are the bundler's: a comparison gives the baseline the
// map sizes it gives deptrace, so both accept the same values.
func (c Config) Validate() error {
	return bundler.Config{FlowMapSize: c.FlowMapSize, PortMapSize: c.PortMapSize, NetNS: c.NetNS}.Validate()
}

type hookKind int

const (
	kindTracepoint hookKind = iota
	kindCgroup
	kindIter
)

// hookDef describes one program: where it attaches, what the kernel must
// offer for it, and what users lose without it.
type hookDef struct {
	program  string
	hook     string // what users see in doctor
	kind     hookKind
	attach   ebpf.AttachType // cgroup hooks only
	requires []string        // names the kernel BTF must hold
	required bool            // deptrace refuses to run without it
	provides string
}

var hookDefs = []hookDef{
	{program: "on_tcp_state", hook: "tp_btf/inet_sock_set_state", kind: kindTracepoint,
		requires: []string{"btf_trace_inet_sock_set_state"}, required: true,
		provides: "TCP connections, failed connection attempts and listening ports"},
	{program: "on_send", hook: "tp_btf/sock_send_length", kind: kindTracepoint,
		requires: []string{"btf_trace_sock_send_length"},
		provides: "bytes sent (TCP and UDP, Linux 6.3+)"},
	{program: "on_recv", hook: "tp_btf/sock_recv_length", kind: kindTracepoint,
		requires: []string{"btf_trace_sock_recv_length"},
		provides: "bytes received (TCP and UDP, Linux 6.3+)"},
	{program: "udp_sendmsg4", hook: "cgroup/sendmsg4", kind: kindCgroup, attach: ebpf.AttachCGroupUDP4Sendmsg,
		provides: "peers of IPv4 UDP datagrams sent with sendto() on unconnected sockets"},
	{program: "udp_sendmsg6", hook: "cgroup/sendmsg6", kind: kindCgroup, attach: ebpf.AttachCGroupUDP6Sendmsg,
		provides: "peers of IPv6 UDP datagrams sent with sendto() on unconnected sockets"},
	{program: "udp_recvmsg4", hook: "cgroup/recvmsg4", kind: kindCgroup, attach: ebpf.AttachCGroupUDP4Recvmsg,
		provides: "peers of IPv4 UDP datagrams received with recvfrom() on unconnected sockets"},
	{program: "udp_recvmsg6", hook: "cgroup/recvmsg6", kind: kindCgroup, attach: ebpf.AttachCGroupUDP6Recvmsg,
		provides: "peers of IPv6 UDP datagrams received with recvfrom() on unconnected sockets"},
	{program: "udp_prebind4", hook: "cgroup/bind4", kind: kindCgroup, attach: ebpf.AttachCGroupInet4Bind,
		provides: "UDP sockets binding a chosen IPv4 port (feeds cgroup/post_bind4)"},
	{program: "udp_prebind6", hook: "cgroup/bind6", kind: kindCgroup, attach: ebpf.AttachCGroupInet6Bind,
		provides: "UDP sockets binding a chosen IPv6 port (feeds cgroup/post_bind6)"},
	{program: "udp_bind4", hook: "cgroup/post_bind4", kind: kindCgroup, attach: ebpf.AttachCGroupInet4PostBind,
		requires: []string{"bpf_rdonly_cast"},
		provides: "UDP bound-port table for IPv4 (direction of UDP flows, Linux 6.2+)"},
	{program: "udp_bind6", hook: "cgroup/post_bind6", kind: kindCgroup, attach: ebpf.AttachCGroupInet6PostBind,
		requires: []string{"bpf_rdonly_cast"},
		provides: "UDP bound-port table for IPv6 (direction of UDP flows, Linux 6.2+)"},
	{program: "udp_release", hook: "cgroup/sock_release", kind: kindCgroup, attach: ebpf.AttachCgroupInetSockRelease,
		requires: []string{"bpf_rdonly_cast"},
		provides: "removal of closed UDP sockets from the bound-port table"},
	{program: "seed_tcp", hook: "iter/tcp", kind: kindIter, requires: []string{"bpf_iter__tcp"},
		provides: "TCP listeners that existed before deptrace started (direction of older connections)"},
	{program: "seed_udp", hook: "iter/udp", kind: kindIter, requires: []string{"bpf_iter__udp"},
		provides: "UDP bound sockets that existed before deptrace started"},
}

// Hook is the state of one program on this kernel, for doctor.
type Hook struct {
	Program  string
	Hook     string
	Active   bool
	Required bool
	Provides string
	Reason   string // why it is not active, one line
	Log      string // the verifier's log when it rejected the program
}

// RequiredHookError is returned by Load when a hook deptrace cannot run
// without is unavailable. Hook.Log holds the verifier log, if any.
type RequiredHookError struct{ Hook Hook }

func (e *RequiredHookError) Error() string {
	return fmt.Sprintf("required hook %s is unavailable: %s", e.Hook.Hook, e.Hook.Reason)
}

// Bundler owns the kernel objects. It is not safe for concurrent use.
type Bundler struct {
	cfg      Config
	shared   *ebpf.Collection // maps only
	flows    *ebpf.Map        // outer array: slot 0 holds the active map
	inner    [2]*ebpf.Map
	active   int
	programs map[string]*ebpf.Program
	links    []link.Link
	iters    map[string]*link.Iter
	hooks    []Hook
	ncpu     int
	batchOK  bool
	idle     [2]map[pereventFlowKey]int // per inner map: drains in a row a flow was idle
	keyBuf   []pereventFlowKey
	valBuf   []pereventFlowValue
}

// Load probes the kernel, loads every program it supports, and attaches
// them. A program that cannot load or attach is recorded as inactive with
// its reason (see Hooks); only a missing required hook is an error.
func Load(cfg Config) (*Bundler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := kernel.CheckCapabilities(); err != nil {
		return nil, err
	}
	if _, err := kernel.BTF(); err != nil {
		return nil, err
	}
	spec, err := loadPerevent()
	if err != nil {
		return nil, fmt.Errorf("parse bundler object: %w", err)
	}
	if err := spec.Variables["target_netns"].Set(cfg.NetNS); err != nil {
		return nil, fmt.Errorf("set target_netns: %w", err)
	}
	if err := spec.Variables["mode"].Set(uint8(cfg.Mode)); err != nil {
		return nil, fmt.Errorf("set mode: %w", err)
	}
	if cfg.Mode == ModeStream {
		spec.Maps["events"].MaxEntries = streamRingSize
	}
	spec.Maps["ports"].MaxEntries = cfg.PortMapSize
	innerSpec := spec.Maps["flows"].InnerMap
	innerSpec.MaxEntries = cfg.FlowMapSize
	if cfg.Mode == ModeFiveTuple {
		// One entry per connection: preallocate, as a per-5-tuple tracer
		// would, so inserts take a free element instead of allocating.
		innerSpec.Flags &^= unix.BPF_F_NO_PREALLOC
	}

	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("count possible CPUs: %w", err)
	}
	b := &Bundler{cfg: cfg, programs: map[string]*ebpf.Program{}, iters: map[string]*link.Iter{}, ncpu: ncpu, batchOK: true,
		idle: [2]map[pereventFlowKey]int{{}, {}}}

	// Maps first, shared by every program (including .rodata, so each
	// program sees the same frozen configuration).
	mapsOnly := spec.Copy()
	mapsOnly.Programs = nil
	b.shared, err = ebpf.NewCollection(mapsOnly)
	if err != nil {
		return nil, fmt.Errorf("create maps: %w", err)
	}
	b.flows = b.shared.Maps["flows"]
	for i := range b.inner {
		s := innerSpec.Copy()
		s.Name = fmt.Sprintf("flows_%c", 'a'+i)
		if b.inner[i], err = ebpf.NewMap(s); err != nil {
			_ = b.Close() // the map's error is the one to report
			return nil, fmt.Errorf("create bundled-flow map: %w", err)
		}
	}
	if err := b.flows.Put(uint32(0), b.inner[0]); err != nil {
		_ = b.Close() // the map's error is the one to report
		return nil, fmt.Errorf("install bundled-flow map: %w", err)
	}

	cgroupRoot, cgroupErr := kernel.CgroupV2Root()
	for _, def := range hookDefs {
		h := Hook{Program: def.program, Hook: def.hook, Required: def.required, Provides: def.provides}
		h.Reason, h.Log = b.loadAndAttach(spec, def, cgroupRoot, cgroupErr)
		h.Active = h.Reason == ""
		if !h.Active && def.required {
			_ = b.Close() // the hook's error is the one to report
			return nil, &RequiredHookError{Hook: h}
		}
		b.hooks = append(b.hooks, h)
	}
	return b, nil
}

// loadAndAttach returns "" on success, or why the hook is not active and,
// for a verifier rejection, the verifier's full log.
func (b *Bundler) loadAndAttach(spec *ebpf.CollectionSpec, def hookDef, cgroupRoot string, cgroupErr error) (reason, log string) {
	for _, name := range def.requires {
		if !kernel.Has(name) {
			return fmt.Sprintf("kernel BTF has no %s", name), ""
		}
	}
	if def.kind == kindCgroup && cgroupErr != nil {
		return cgroupErr.Error(), ""
	}
	one := spec.Copy()
	for name := range one.Programs {
		if name != def.program {
			delete(one.Programs, name)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{MapReplacements: b.shared.Maps})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			last := ""
			if n := len(ve.Log); n > 0 {
				last = ve.Log[n-1]
			}
			return fmt.Sprintf("verifier rejected %s (%s); deptrace doctor prints the full log", def.program, last), fmt.Sprintf("%+v", ve)
		}
		return fmt.Sprintf("load: %v", err), ""
	}
	prog := coll.DetachProgram(def.program)
	coll.Close()
	b.programs[def.program] = prog

	switch def.kind {
	case kindTracepoint:
		l, err := link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			return fmt.Sprintf("attach: %v", err), ""
		}
		b.links = append(b.links, l)
	case kindCgroup:
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: def.attach, Program: prog})
		if err != nil {
			return fmt.Sprintf("attach to %s: %v", cgroupRoot, err), ""
		}
		b.links = append(b.links, l)
	case kindIter:
		it, err := link.AttachIter(link.IterOptions{Program: prog})
		if err != nil {
			return fmt.Sprintf("attach: %v", err), ""
		}
		b.iters[def.program] = it
	}
	return "", ""
}

// Hooks lists every hook with its state on this kernel.
func (b *Bundler) Hooks() []Hook { return append([]Hook(nil), b.hooks...) }

// Close detaches and frees everything. Safe to call more than once.
func (b *Bundler) Close() error {
	for _, l := range b.links {
		l.Close()
	}
	b.links = nil
	for _, it := range b.iters {
		it.Close()
	}
	b.iters = map[string]*link.Iter{}
	for _, p := range b.programs {
		p.Close()
	}
	b.programs = map[string]*ebpf.Program{}
	for i, m := range b.inner {
		if m != nil {
			m.Close()
			b.inner[i] = nil
		}
	}
	if b.shared != nil {
		b.shared.Close()
		b.shared = nil
	}
	return nil
}

// Entry is one bundled flow drained from the kernel, CPUs summed.
type Entry struct {
	NetNS             uint32
	Proto             uint8
	Direction         uint8
	Port              uint16
	Local, Remote     netip.Addr // IPv4 unmapped
	ClientPort        uint16     // per-5-tuple mode only
	Connections       uint64
	FailedConnections uint64
	BytesSent         uint64
	BytesReceived     uint64
	FirstSeenBootNs   uint64 // CLOCK_BOOTTIME
	LastSeenBootNs    uint64
	PID               uint32
	Comm              string
	CgroupID          uint64
}

// Drain swaps in the idle bundled-flow map, then reads and empties the one
// programs wrote to until now. The swap returns only after an RCU grace
// period, so no program can still be writing to the drained map: no entry
// and no increment is lost between intervals.
func (b *Bundler) Drain() ([]Entry, error) {
	next := 1 - b.active
	if err := b.flows.Put(uint32(0), b.inner[next]); err != nil {
		return nil, fmt.Errorf("swap bundled-flow map: %w", err)
	}
	oldIdx := b.active
	old := b.inner[oldIdx]
	b.active = next

	if b.batchOK {
		entries, err := b.drainBatch(old, oldIdx)
		if err == nil {
			return entries, nil
		}
		// Kernels before 5.6 have no batch operations: iterate instead,
		// but only if nothing was read, so no entry is reported twice.
		if len(entries) > 0 || !errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, unix.EINVAL) {
			return entries, fmt.Errorf("drain bundled flows: %w", err)
		}
		b.batchOK = false
	}
	entries, err := b.drainIterate(old)
	return entries, err
}

// BatchSupported reports whether drains use batch lookup-and-delete.
func (b *Bundler) BatchSupported() bool { return b.batchOK }

// retainIdle is how many drains of one map in a row a flow may be idle in
// before its entry is deleted (bundle mode).
const retainIdle = 2

func (b *Bundler) drainBatch(m *ebpf.Map, idx int) ([]Entry, error) {
	if b.cfg.Mode != ModeBundle {
		// Per-5-tuple entries never recur: take and delete them.
		keys, vals, err := b.readAll(m, true)
		return b.merged(keys, vals), err
	}
	// Bundled flows recur every interval. Keep their entries, zeroed, so
	// that next time this map is active their events find them instead of
	// inserting: an insert costs microseconds when the kernel's allocator
	// refills, a lookup tens of nanoseconds. A flow idle for retainIdle
	// drains of this map in a row is deleted.
	keys, vals, err := b.readAll(m, false)
	out := b.merged(keys, vals)
	if err != nil {
		return out, err
	}
	idle := b.idle[idx]
	var zeroKeys, delKeys []pereventFlowKey
	var zeroVals []pereventFlowValue
	for i, k := range keys {
		e := out[i]
		if e.Connections == 0 && e.FailedConnections == 0 && e.BytesSent == 0 && e.BytesReceived == 0 {
			if idle[k]++; idle[k] >= retainIdle {
				delete(idle, k)
				delKeys = append(delKeys, k)
				continue
			}
		} else {
			delete(idle, k)
		}
		zeroKeys = append(zeroKeys, k)
		for _, v := range vals[i*b.ncpu : (i+1)*b.ncpu] {
			// Keep the process: a flow whose next interval has only
			// softirq events stays named.
			zeroVals = append(zeroVals, pereventFlowValue{Pid: v.Pid, Comm: v.Comm, CgroupId: v.CgroupId})
		}
	}
	if len(zeroKeys) > 0 {
		// No BPF_EXIST: batch updates take no element flags but BPF_F_LOCK;
		// nothing deletes these keys while the map is idle anyway.
		if _, err := m.BatchUpdate(zeroKeys, zeroVals, nil); err != nil {
			return out, fmt.Errorf("reset bundled flows: %w", err)
		}
	}
	if len(delKeys) > 0 {
		if _, err := m.BatchDelete(delKeys, nil); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, fmt.Errorf("delete idle flows: %w", err)
		}
	}
	return out, nil
}

// readAll reads every entry of m with batch operations, deleting them too
// when del is set.
func (b *Bundler) readAll(m *ebpf.Map, del bool) ([]pereventFlowKey, []pereventFlowValue, error) {
	batch := 1024
	var keys []pereventFlowKey
	var vals []pereventFlowValue
	var cursor ebpf.MapBatchCursor
	for {
		if len(b.keyBuf) < batch {
			b.keyBuf = make([]pereventFlowKey, batch)
			b.valBuf = make([]pereventFlowValue, batch*b.ncpu)
		}
		var n int
		var err error
		if del {
			n, err = m.BatchLookupAndDelete(&cursor, b.keyBuf[:batch], b.valBuf[:batch*b.ncpu], nil)
		} else {
			n, err = m.BatchLookup(&cursor, b.keyBuf[:batch], b.valBuf[:batch*b.ncpu], nil)
		}
		keys = append(keys, b.keyBuf[:n]...)
		vals = append(vals, b.valBuf[:n*b.ncpu]...)
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return keys, vals, nil
		case errors.Is(err, unix.ENOSPC) && batch < 1<<20:
			// A hash bucket holds more keys than the batch: grow, retry.
			batch *= 4
		case err != nil:
			return keys, vals, err
		}
	}
}

func (b *Bundler) merged(keys []pereventFlowKey, vals []pereventFlowValue) []Entry {
	out := make([]Entry, len(keys))
	for i, k := range keys {
		out[i] = merge(k, vals[i*b.ncpu:(i+1)*b.ncpu])
	}
	return out
}

func (b *Bundler) drainIterate(m *ebpf.Map) ([]Entry, error) {
	var out []Entry
	var keys []pereventFlowKey
	var k pereventFlowKey
	vals := make([]pereventFlowValue, b.ncpu)
	it := m.Iterate()
	for it.Next(&k, &vals) {
		out = append(out, merge(k, vals))
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("iterate bundled flows: %w", err)
	}
	for i := range keys {
		if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, fmt.Errorf("delete bundled flow: %w", err)
		}
	}
	return out, nil
}

// Event is one stream-mode event.
type Event struct {
	Entry       // key fields; counters unset
	Kind  uint8 // EventOpen, EventFailed, EventUDPSend, EventUDPRecv
	Bytes uint32
}

// Stream event kinds, as bundler.h defines them.
const (
	EventOpen    = 1
	EventFailed  = 2
	EventUDPSend = 3
	EventUDPRecv = 4
)

// EventReader reads stream-mode events. Close the bundler to stop it.
func (b *Bundler) EventReader() (*ringbuf.Reader, error) {
	if b.cfg.Mode != ModeStream {
		return nil, errors.New("event reader: the bundler is not in stream mode")
	}
	return ringbuf.NewReader(b.shared.Maps["events"])
}

// DecodeEvent parses one ring-buffer record.
func DecodeEvent(raw []byte) (Event, error) {
	var e pereventStreamEvent
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, &e); err != nil {
		return Event{}, fmt.Errorf("decode stream event: %w", err)
	}
	return Event{Entry: merge(e.Key, nil), Kind: e.Kind, Bytes: e.Bytes}, nil
}

// merge sums one flow's per-CPU slots. The process is taken from the slot
// that saw it last.
func merge(k pereventFlowKey, cpus []pereventFlowValue) Entry {
	e := Entry{
		NetNS:      k.Netns,
		Proto:      k.Proto,
		Direction:  k.Direction,
		Port:       k.Port,
		ClientPort: k.ClientPort,
		Local:      netip.AddrFrom16(k.LocalAddr).Unmap(),
		Remote:     netip.AddrFrom16(k.RemoteAddr).Unmap(),
	}
	var procSeen uint64
	for _, v := range cpus {
		e.Connections += v.Connections
		e.FailedConnections += v.FailedConnections
		e.BytesSent += v.BytesSent
		e.BytesReceived += v.BytesReceived
		if v.FirstSeenNs != 0 && (e.FirstSeenBootNs == 0 || v.FirstSeenNs < e.FirstSeenBootNs) {
			e.FirstSeenBootNs = v.FirstSeenNs
		}
		if v.LastSeenNs > e.LastSeenBootNs {
			e.LastSeenBootNs = v.LastSeenNs
		}
		if v.Pid != 0 && v.LastSeenNs >= procSeen {
			procSeen = v.LastSeenNs
			e.PID = v.Pid
			e.Comm = commString(v.Comm)
			e.CgroupID = v.CgroupId
		}
	}
	return e
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

// Stats are the kernel side's loss counters and program statistics.
type Stats struct {
	FlowInsertFailed    uint64 // events lost: bundled-flow map full
	PortInsertFailed    uint64 // listening ports not tracked: port table full
	UDPPeerUnknown      uint64 // UDP datagrams on unconnected sockets with no peer seen
	PendingInsertFailed uint64 // UDP peers not remembered: no socket storage
	RecursionMisses     uint64 // program runs the kernel skipped (nested on one CPU)
	StreamDropped       uint64 // stream mode only: events the ring buffer had no room for
	Programs            map[string]ProgramStats
}

// ProgramStats are per-program run count and run time; RunTime and
// RunCount only grow while kernel.bpf_stats_enabled is on.
type ProgramStats struct {
	RunCount        uint64
	RunTime         time.Duration
	RecursionMisses uint64
}

// Lost is the total of every loss counter.
func (s Stats) Lost() uint64 {
	return s.FlowInsertFailed + s.PortInsertFailed + s.UDPPeerUnknown + s.PendingInsertFailed + s.RecursionMisses + s.StreamDropped
}

// Stats reads the loss counters (cumulative since Load).
func (b *Bundler) Stats() (Stats, error) {
	var s Stats
	m := b.shared.Maps["stats"]
	read := func(idx pereventStatIndex) (uint64, error) {
		vals := make([]uint64, b.ncpu)
		if err := m.Lookup(uint32(idx), &vals); err != nil {
			return 0, fmt.Errorf("read loss counter %d: %w", idx, err)
		}
		var sum uint64
		for _, v := range vals {
			sum += v
		}
		return sum, nil
	}
	var err error
	if s.FlowInsertFailed, err = read(pereventStatIndexSTAT_FLOW_INSERT_FAILED); err != nil {
		return s, err
	}
	if s.PortInsertFailed, err = read(pereventStatIndexSTAT_PORT_INSERT_FAILED); err != nil {
		return s, err
	}
	if s.UDPPeerUnknown, err = read(pereventStatIndexSTAT_UDP_PEER_UNKNOWN); err != nil {
		return s, err
	}
	if s.PendingInsertFailed, err = read(pereventStatIndexSTAT_PENDING_INSERT_FAILED); err != nil {
		return s, err
	}
	if s.StreamDropped, err = read(pereventStatIndexSTAT_STREAM_DROPPED); err != nil {
		return s, err
	}
	s.Programs = map[string]ProgramStats{}
	for name, p := range b.programs {
		if _, isIter := b.iters[name]; isIter {
			continue
		}
		ps, err := p.Stats()
		if err != nil {
			return s, fmt.Errorf("read stats of %s: %w", name, err)
		}
		s.Programs[name] = ProgramStats{RunCount: ps.RunCount, RunTime: ps.Runtime, RecursionMisses: ps.RecursionMisses}
		s.RecursionMisses += ps.RecursionMisses
	}
	return s, nil
}

// SeedReport says what seeding found.
type SeedReport struct {
	Namespaces int // namespaces visited
	Ports      int // listening ports written to the table
	Errors     []string
}

// Seed walks every network namespace (or the configured one) with the TCP
// and UDP socket iterators and writes the listeners that already exist into
// the port table, so that connections of services started before deptrace
// get the right direction. Run it after Load: a socket that starts
// listening meanwhile is counted by its tracepoint and by the iterator, and
// the iterator's count, which sees every current listener, wins.
func (b *Bundler) Seed() (SeedReport, error) {
	var rep SeedReport
	if len(b.iters) == 0 {
		return rep, errors.New("no socket iterator is active on this kernel")
	}
	namespaces, err := netns.List()
	if err != nil {
		return rep, err
	}
	counts := map[pereventPortKey]uint32{}
	for _, ns := range namespaces {
		if b.cfg.NetNS != 0 && ns.Inode != b.cfg.NetNS {
			continue
		}
		rep.Namespaces++
		err := netns.Do(ns.Path, func() error {
			for _, name := range []string{"seed_tcp", "seed_udp"} {
				it, ok := b.iters[name]
				if !ok {
					continue
				}
				recs, err := readIter(it)
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				for _, r := range recs {
					counts[pereventPortKey{Netns: r.Netns, Port: r.Port, Proto: r.Proto}]++
				}
			}
			return nil
		})
		if err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("netns %d: %v", ns.Inode, err))
		}
	}
	ports := b.shared.Maps["ports"]
	anyCounts := map[uint32]uint32{}
	for k, n := range counts {
		anyCounts[listenAnyIndex(k.Proto, k.Port)] += n
	}
	for idx, n := range anyCounts {
		if err := b.shared.Maps["listen_any"].Update(idx, n, ebpf.UpdateAny); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("listen_any: %v", err))
		}
	}
	for k, n := range counts {
		var v pereventPortValue
		_ = ports.Lookup(&k, &v) // keep the process a tracepoint recorded
		v.Refs = n
		if err := ports.Update(&k, &v, ebpf.UpdateAny); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("port table: %v", err))
			continue
		}
		rep.Ports++
	}
	if len(rep.Errors) > 0 {
		return rep, fmt.Errorf("seed listening ports: %s", strings.Join(rep.Errors, "; "))
	}
	return rep, nil
}

// listenAnyIndex mirrors listen_any_slot in bundler.bpf.c.
func listenAnyIndex(proto uint8, port uint16) uint32 {
	if proto == unix.IPPROTO_UDP {
		return 65536 + uint32(port)
	}
	return uint32(port)
}

func readIter(it *link.Iter) ([]pereventListenRecord, error) {
	rd, err := it.Open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rd.Close() }() // a read-only iterator
	raw, err := io.ReadAll(rd)
	if err != nil {
		return nil, err
	}
	recs := make([]pereventListenRecord, len(raw)/8)
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, recs); err != nil {
		return nil, err
	}
	return recs, nil
}

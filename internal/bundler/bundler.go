package bundler

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/kernel"
)

// Directions as the kernel program writes them (enum direction in bundler.h).
const (
	DirOutbound = uint8(bundlerDirectionDIR_OUTBOUND) // the local end is the client
	DirInbound  = uint8(bundlerDirectionDIR_INBOUND)  // the local end is the server
)

// Config sizes the kernel maps and picks the namespaces to trace.
type Config struct {
	// FlowMapSize is the most distinct bundled flows one interval holds.
	// Past it, counts are lost and counted (Stats.FlowMapFull).
	FlowMapSize uint32
	// PortMapSize is the most TCP listening ports tracked across namespaces.
	PortMapSize uint32
	// NetNS limits tracing to one network namespace (inode); 0 traces all.
	NetNS uint32
	// PinPath, when set, pins the kernel side there (a directory on bpffs,
	// such as /sys/fs/bpf/deptrace) so that it keeps counting when this
	// process dies, and adopts a kernel side a previous process left there.
	PinPath string
	// SyscallTracepoints allows the connect system call's exit tracepoint
	// where fexit is missing (failed unix connects, TCP connects rejected
	// before any SYN). Off by default: while any system-call tracepoint
	// is attached, every system call of every process takes the kernel's
	// slower exit path (docs/performance.md).
	SyscallTracepoints bool
	// SeedFollows says the caller runs Seed right after Load, then
	// PinSeeded: until Seed has tagged the connections open at start,
	// none is tagged late as if its open had been seen (it would count
	// every byte since its open, not since the start), and a connection
	// that opens takes storage at once. With a PinPath the side is pinned
	// by PinSeeded, once seeded: a process that dies before leaves
	// nothing to adopt that would hold the start's state for good.
	SeedFollows bool
}

// Limits of Config values, also used for flag validation.
const (
	MinMapSize     = 64
	MaxFlowMapSize = 1 << 22
	MaxPortMapSize = 1 << 20
)

// Validate checks every field and names the allowed range.
func (c Config) Validate() error {
	if c.FlowMapSize < MinMapSize || c.FlowMapSize > MaxFlowMapSize {
		return fmt.Errorf("invalid flow map size %d: allowed %d to %d", c.FlowMapSize, MinMapSize, MaxFlowMapSize)
	}
	if c.PortMapSize < MinMapSize || c.PortMapSize > MaxPortMapSize {
		return fmt.Errorf("invalid port map size %d: allowed %d to %d", c.PortMapSize, MinMapSize, MaxPortMapSize)
	}
	return nil
}

type hookKind int

const (
	kindTracepoint hookKind = iota
	kindCgroup
	kindIter        // run on demand, once per network namespace
	kindStorageIter // run on demand over deptrace's socket storage
	kindFexit       // fallback for kernels without a tracepoint
	kindSyscall     // a classic syscalls/ tracepoint, where fexit is missing
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
	// fallbackFor names the programs (comma-separated) this one replaces
	// where they cannot run; it is loaded only then, not where all of
	// them run.
	fallbackFor string
	// unsafe says why this kernel must not run the program although it
	// would load ("" where it is safe); its fallbacks then stand in.
	unsafe func() string
	// copies: where copies of the program recover the runs the kernel
	// skips for recursion (copies.go).
	copies copyPolicy
}

// FlowCacheSlots is the kernel side's flow cache, in flows per CPU and
// interval: what an interval holds beyond the flow map and the spill
// (bpf/bundler.bpf.c, CACHE_SLOTS; Load checks the two agree).
const FlowCacheSlots = 64

// SpillSlots is the spill's size per half for a flow map of flowMapSize:
// an eighth of it as a power of two, 256 to 65,536 (bpf/bundler.bpf.c,
// spill_slots). Flows go there when their insert into the flow map fails
// (a full map, the kernel's allocator caught short, an update nested in
// another) or another program is zeroing their value; what finds no slot
// is lost (and counted).
func SpillSlots(flowMapSize uint32) uint32 {
	n := uint32(256)
	for n < flowMapSize/8 && n < 65536 {
		n *= 2
	}
	return n
}

// storageIterUnsafe: from 7.0, freeing a socket clears its storage
// element's owner pointer (bpf_selem_unlink_nofail) while the socket-storage
// map iterator may still show that element, and the kernel's
// __bpf_sk_storage_map_seq_show dereferences it unchecked: an oops, seen in
// Debian's 7.3 (docs/install.md). The rework that brought it also gave
// bpf_local_storage_elem its "state" member, by which it is recognised.
func storageIterUnsafe() string {
	if testHooks.tableHarvest || kernel.HasMember("bpf_local_storage_elem", "state") {
		return "unsafe on this kernel: its socket-storage map iterator can oops while sockets are freed (Linux 7.0+); harvest_tcp/harvest_udp stand in"
	}
	return ""
}

var hookDefs = []hookDef{
	{program: "on_tcp_state", hook: "tp_btf/inet_sock_set_state", kind: kindTracepoint,
		requires: []string{"btf_trace_inet_sock_set_state"}, required: true, copies: copiesAlways,
		provides: "TCP connections, their bytes (read from the socket at close), failures by cause, connect latency, listening ports"},
	{program: "harvest", hook: "iter/bpf_sk_storage_map", kind: kindStorageIter,
		requires: []string{"bpf_iter__bpf_sk_storage_map"}, required: true, unsafe: storageIterUnsafe,
		provides: "bytes of live TCP connections and connected UDP sockets at every drain; listen-queue state"},
	{program: "harvest_tcp", hook: "iter/tcp (harvest)", kind: kindIter, requires: []string{"bpf_iter__tcp"}, fallbackFor: "harvest",
		provides: "the harvest of live TCP connections and listeners, walking each namespace's socket table, where the storage iterator is unsafe"},
	{program: "harvest_udp", hook: "iter/udp (harvest)", kind: kindIter, requires: []string{"bpf_iter__udp"}, fallbackFor: "harvest",
		provides: "the harvest of connected UDP sockets, walking each namespace's socket table, where the storage iterator is unsafe"},
	{program: "on_send_reset", hook: "tp_btf/tcp_send_reset", kind: kindTracepoint,
		requires: []string{"btf_trace_tcp_send_reset"},
		provides: "TCP resets sent, per flow"},
	{program: "on_receive_reset", hook: "tp_btf/tcp_receive_reset", kind: kindTracepoint,
		requires: []string{"btf_trace_tcp_receive_reset"},
		provides: "TCP resets received, per flow"},
	{program: "on_send", hook: "tp_btf/sock_send_length", kind: kindTracepoint,
		requires: []string{"btf_trace_sock_send_length"}, copies: copiesPreemptible,
		provides: "UDP datagrams and bytes sent; unix-socket dependencies, both processes named (Linux 6.3+)"},
	{program: "on_recv", hook: "tp_btf/sock_recv_length", kind: kindTracepoint,
		requires: []string{"btf_trace_sock_recv_length"}, copies: copiesPreemptible,
		provides: "UDP datagrams and bytes received; unix-socket dependencies (Linux 6.3+)"},
	{program: "on_inet_send_fexit", hook: "fexit/inet_sendmsg", kind: kindFexit, requires: []string{"inet_sendmsg"}, fallbackFor: "on_send",
		provides: "UDP datagrams sent (IPv4 sockets), where sock_send_length is missing (before 6.3)"},
	{program: "on_inet6_send_fexit", hook: "fexit/inet6_sendmsg", kind: kindFexit, requires: []string{"inet6_sendmsg"}, fallbackFor: "on_send",
		provides: "UDP datagrams sent (IPv6 sockets), where sock_send_length is missing (before 6.3)"},
	{program: "on_unix_stream_send_fexit", hook: "fexit/unix_stream_sendmsg", kind: kindFexit, requires: []string{"unix_stream_sendmsg"}, fallbackFor: "on_send",
		provides: "unix stream data sent, where sock_send_length is missing (before 6.3)"},

	{program: "on_recv_fexit", hook: "fexit/sock_recvmsg", kind: kindFexit, requires: []string{"sock_recvmsg"}, fallbackFor: "on_recv",
		provides: "UDP datagrams and unix sockets received, where sock_recv_length is missing (before 6.3)"},
	{program: "on_unix_connect_fexit", hook: "fexit/unix_stream_connect", kind: kindFexit, requires: []string{"unix_stream_connect"},
		provides: "failed unix stream and seqpacket connects (no listener, refused, full backlog), by cause"},
	{program: "on_unix_dgram_connect_fexit", hook: "fexit/unix_dgram_connect", kind: kindFexit, requires: []string{"unix_dgram_connect"},
		provides: "failed unix datagram connects (no socket at the path), by cause"},
	{program: "on_inet_connect_fexit", hook: "fexit/inet_stream_connect", kind: kindFexit, requires: []string{"inet_stream_connect"},
		provides: "TCP connects that fail before any SYN (no route, prohibited, refused by policy)"},
	{program: "on_connect_exit", hook: "tracepoint/syscalls/sys_exit_connect", kind: kindSyscall,
		fallbackFor: "on_unix_connect_fexit,on_unix_dgram_connect_fexit,on_inet_connect_fexit",
		provides:    "failed unix connects and TCP connects failing before any SYN, where fexit is missing (every system call takes the kernel's slower exit path while it is attached)"},
	{program: "connect_error", hook: "cgroup/getsockopt", kind: kindCgroup, attach: ebpf.AttachCGroupGetsockopt,
		provides: "the cause of a failed connect whose error the application read itself (SO_ERROR) before closing"},
	{program: "udp_sendmsg4", hook: "cgroup/sendmsg4", kind: kindCgroup, attach: ebpf.AttachCGroupUDP4Sendmsg,
		provides: "peers of IPv4 UDP datagrams sent with sendto() on unconnected sockets"},
	{program: "udp_sendmsg6", hook: "cgroup/sendmsg6", kind: kindCgroup, attach: ebpf.AttachCGroupUDP6Sendmsg,
		provides: "peers of IPv6 UDP datagrams sent with sendto() on unconnected sockets"},
	{program: "unix_sendmsg", hook: "cgroup/sendmsg_unix", kind: kindCgroup, attach: ebpf.AttachCgroupUnixSendmsg, requires: []string{"bpf_sock_addr_kern"},
		provides: "unix datagrams sent with sendto() to a path on unconnected sockets, as journald clients send (Linux 6.7+)"},
	{program: "on_unix_dgram_send_fexit", hook: "fexit/unix_dgram_sendmsg", kind: kindFexit, requires: []string{"unix_dgram_sendmsg"}, fallbackFor: "on_send,unix_sendmsg",
		provides: "unix datagrams sent, where sock_send_length is missing (before 6.3), and those sent to a path, where cgroup/sendmsg_unix is (before 6.7)"},
	{program: "udp_recvmsg4", hook: "cgroup/recvmsg4", kind: kindCgroup, attach: ebpf.AttachCGroupUDP4Recvmsg,
		provides: "peers of IPv4 UDP datagrams received with recvfrom() on unconnected sockets"},
	{program: "udp_recvmsg6", hook: "cgroup/recvmsg6", kind: kindCgroup, attach: ebpf.AttachCGroupUDP6Recvmsg,
		provides: "peers of IPv6 UDP datagrams received with recvfrom() on unconnected sockets"},
	{program: "udp_post_bind4", hook: "cgroup/post_bind4", kind: kindCgroup, attach: ebpf.AttachCGroupInet4PostBind,
		provides: "which end an IPv4 UDP socket bound to a port the kernel chose is, from its first datagram (a DNS forwarder behind a NAT rule, as Docker's embedded DNS)"},
	{program: "udp_post_bind6", hook: "cgroup/post_bind6", kind: kindCgroup, attach: ebpf.AttachCGroupInet6PostBind,
		provides: "which end an IPv6 UDP socket bound to a port the kernel chose is, from its first datagram"},
	{program: "udp_release", hook: "cgroup/sock_release", kind: kindCgroup, attach: ebpf.AttachCgroupInetSockRelease,
		provides: "the last datagrams of a connected UDP socket that closes between drains"},
	{program: "seed_listeners", hook: "iter/tcp (listeners)", kind: kindIter, requires: []string{"bpf_iter__tcp"},
		provides: "TCP listeners that existed before deptrace started (direction of older connections)"},
	{program: "tag_connections", hook: "iter/tcp (connections)", kind: kindIter, requires: []string{"bpf_iter__tcp"},
		provides: "bytes of TCP connections opened before deptrace started, counted from start"},
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
	// Standby: a fallback not loaded because what it replaces runs.
	Standby bool
	// Replaces is the program this fallback stands in for ("" if none).
	Replaces string
	// Off: not loaded because the configuration leaves it off (Reason
	// names the option).
	Off bool
	// Copies of the program attached after it, which recover the runs
	// the kernel skips for recursion; CopiesMissing says why a program
	// that should have them runs alone.
	Copies        []string
	CopiesMissing string
}

// RequiredHookError is returned by Load when a hook deptrace cannot run
// without is unavailable. Hook.Log holds the verifier log, if any.
type RequiredHookError struct{ Hook Hook }

func (e *RequiredHookError) Error() string {
	return fmt.Sprintf("required hook %s is unavailable: %s", e.Hook.Hook, e.Hook.Reason)
}

// sharedObjects is what bpf2go generates for the shared collection: every
// map and variable of the object, by its C name.
type sharedObjects struct {
	bundlerMaps
	bundlerVariables
}

// Bundler owns the kernel objects. It is not safe for concurrent use.
type Bundler struct {
	cfg      Config
	shared   *ebpf.Collection // maps only
	objs     sharedObjects    // shared's maps and variables, typed
	flows    *ebpf.Map        // outer array: slot i holds inner[i]
	inner    [2]*ebpf.Map
	active   int // the inner map programs count into (interval_now & 1)
	programs map[string]*ebpf.Program
	links    []link.Link
	linkOf   map[string]link.Link // attached program -> its link, for pinning
	copies   map[string][]string  // program -> its attached copies, in order (copies.go)
	copyErr  map[string]string    // program -> why its copies are not attached
	iters    map[string]*link.Iter
	hooks    []Hook
	ncpu     int
	drain    drainState
	lock     *agentLock // owns PinPath
	pinned   bool
	// pinAfterSeed: Load left a fresh side with a PinPath unpinned until
	// its seed ends (PinSeeded), so that no pinned side holds seed_pending.
	pinAfterSeed bool
	seedNotEnded bool // Seed could not clear seed_pending
	adopt        AdoptReport
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
	if err := kernel.Prepare(); err != nil {
		return nil, err
	}
	spec, err := loadBundler()
	if err != nil {
		return nil, fmt.Errorf("parse bundler object: %w", err)
	}
	var specs bundlerSpecs
	if err := spec.Assign(&specs); err != nil {
		return nil, fmt.Errorf("parse bundler object: %w", err)
	}
	if err := specs.TargetNetns.Set(cfg.NetNS); err != nil {
		return nil, fmt.Errorf("set target_netns: %w", err)
	}
	if err := specs.RecTaskMarks.Set(boolU32(recTaskMarks())); err != nil {
		return nil, fmt.Errorf("set rec_task_marks: %w", err)
	}
	if testHooks.connectHash {
		if err := specs.ConnectSlotsOff.Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("set connect_slots_off: %w", err)
		}
	}
	if testHooks.noCache {
		if err := specs.CacheOff.Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("set cache_off: %w", err)
		}
	}
	if got := specs.FlowCache.MaxEntries; got != 2*FlowCacheSlots {
		return nil, fmt.Errorf("flow cache: the object has %d slots, FlowCacheSlots says %d per half", got, FlowCacheSlots)
	}
	if err := setSpillOnly(&specs); err != nil {
		return nil, err
	}
	specs.Ports.MaxEntries = cfg.PortMapSize
	spillSlots := SpillSlots(cfg.FlowMapSize)
	specs.Spill.MaxEntries = 2 * spillSlots
	if err := specs.SpillSlots.Set(spillSlots); err != nil {
		return nil, fmt.Errorf("set spill_slots: %w", err)
	}
	innerSpec := specs.Flows.InnerMap
	innerSpec.MaxEntries = cfg.FlowMapSize

	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("count possible CPUs: %w", err)
	}
	b := &Bundler{cfg: cfg, programs: map[string]*ebpf.Program{}, iters: map[string]*link.Iter{}, linkOf: map[string]link.Link{}, copies: map[string][]string{}, copyErr: map[string]string{}, ncpu: ncpu}
	b.drain.init()

	var old *pinnedSide
	if cfg.PinPath != "" {
		if b.adopt.MountedBPFFS, err = ensureBPFFS(cfg.PinPath); err != nil {
			return nil, err
		}
		if b.lock, err = lockAgent(cfg.PinPath); err != nil {
			return nil, err
		}
		var found bool
		old, found, err = loadPinned(cfg.PinPath)
		if found && err == nil {
			if why := old.compatible(spec, specs.Flows, cfg); why != "" {
				b.adopt.Replaced = why
				sv := old.salvage(ncpu)
				b.adopt.Salvaged, b.adopt.SalvagedPending, b.adopt.Unreadable = sv.current, sv.pending.Entries, sv.unreadable
				if sv.pending.Gen != 0 {
					b.drain.salvaged = &sv.pending
				}
				if err := removePinned(cfg.PinPath, old); err != nil {
					b.lock.release()
					return nil, fmt.Errorf("remove the kernel side pinned at %s (%s): %w", cfg.PinPath, why, err)
				}
				old = nil
			}
		} else if found {
			_ = removePinned(cfg.PinPath, old) // best effort: an unreadable pin is replaced anyway, and err says why
			b.adopt.Replaced = err.Error()
			old = nil
		}
	}

	// Maps first, shared by every program (including .rodata, so each
	// program sees the same frozen configuration). An adopted side's maps
	// replace the fresh ones.
	mapsOnly := spec.Copy()
	mapsOnly.Programs = nil
	b.shared, err = ebpf.NewCollection(mapsOnly)
	if err != nil {
		b.Release()
		if why := kernel.TooOldForMaps(err); why != "" {
			return nil, errors.New(why)
		}
		return nil, fmt.Errorf("create maps: %w", err)
	}
	if old != nil {
		for name, m := range old.maps {
			b.shared.Maps[name].Close()
			b.shared.Maps[name] = m
		}
		b.inner = old.inner
		old.maps, old.inner = nil, [2]*ebpf.Map{}
	} else {
		for i := range b.inner {
			s := innerSpec.Copy()
			s.Name = fmt.Sprintf("flows_%c", 'a'+i)
			if b.inner[i], err = ebpf.NewMap(s); err != nil {
				b.Release()
				return nil, fmt.Errorf("create bundled-flow map: %w", err)
			}
		}
	}
	// The typed view of shared: shared keeps ownership (Release closes it,
	// pinning finds its maps by name), so the view is assigned from a copy
	// of its indexes, which Assign empties.
	view := &ebpf.Collection{Maps: maps.Clone(b.shared.Maps), Variables: maps.Clone(b.shared.Variables)}
	if err := view.Assign(&b.objs); err != nil {
		b.Release()
		return nil, fmt.Errorf("create maps: %w", err)
	}
	b.flows = b.objs.Flows
	// Before any program attaches. Not for an adopted side, whose
	// programs keep the .bss of the process that made them: a side is
	// pinned only once seeded (PinSeeded), so theirs holds 0.
	if cfg.SeedFollows && old == nil {
		if err := b.objs.SeedPending.Set(uint32(1)); err != nil {
			b.Release()
			return nil, fmt.Errorf("set seed_pending: %w", err)
		}
	}
	if old != nil {
		if err := b.findActive(); err != nil {
			b.Release()
			return nil, err
		}
	} else if err := b.installFlowMaps(); err != nil {
		b.Release()
		return nil, err
	}

	cgroupRoot, cgroupErr := kernel.CgroupV2Root()
	for _, def := range hookDefs {
		h := Hook{Program: def.program, Hook: def.hook, Required: def.required, Provides: def.provides, Replaces: def.fallbackFor}
		if def.fallbackFor != "" && b.allActive(def.fallbackFor) {
			h.Standby = true
			h.Reason = "not needed: " + def.fallbackFor + " is active"
			b.hooks = append(b.hooks, h)
			continue
		}
		if def.kind == kindSyscall && !cfg.SyscallTracepoints {
			h.Off = true
			h.Reason = "off: it makes every system call of every process take the kernel's slower exit path; --syscall-tracepoints turns it on"
			b.hooks = append(b.hooks, h)
			continue
		}
		if def.unsafe != nil {
			if why := def.unsafe(); why != "" {
				h.Reason = why
				b.hooks = append(b.hooks, h)
				continue
			}
		}
		if l, ok := old.adoptLink(def); ok {
			b.links = append(b.links, l)
			b.linkOf[def.program] = l
			b.adoptCopies(old, def)
		} else if old != nil && (def.kind == kindTracepoint || def.kind == kindCgroup || def.kind == kindFexit || def.kind == kindSyscall) {
			h.Reason = "not attached in the adopted kernel side"
		} else {
			h.Reason, h.Log = b.loadAndAttach(spec, def, cgroupRoot, cgroupErr)
		}
		h.Active = h.Reason == ""
		h.Copies, h.CopiesMissing = b.copies[def.program], b.copyErr[def.program]
		if !h.Active && def.required && !hasFallback(def.program) {
			_ = b.Close() // the hook's error is the one to report
			return nil, &RequiredHookError{Hook: h}
		}
		b.hooks = append(b.hooks, h)
	}
	// A required hook with fallbacks is satisfied when one of them runs.
	for _, h := range b.hooks {
		if h.Required && !h.Active && !b.replaced(h.Program) {
			_ = b.Close() // the hook's error is the one to report
			return nil, &RequiredHookError{Hook: h}
		}
	}
	if old != nil {
		old.close()
		b.adopt.Adopted, b.pinned = true, true
		// A DNS watcher whose agent died left its programs in the
		// arrays, writing to a ring buffer no one reads: this agent's
		// watcher, if any, puts its own.
		if err := b.clearDNSCalls(); err != nil {
			b.Release() // the pins stay, with what the side counted
			return nil, err
		}
		// Its drain record now: a side that cannot be resumed is
		// refused at start, not after three failed drains.
		if err := b.loadDrainState(); err != nil {
			b.Release() // the pins stay, with what the side counted
			return nil, err
		}
	} else if cfg.PinPath != "" && cfg.SeedFollows {
		b.pinAfterSeed = true
	} else if cfg.PinPath != "" {
		if err := b.pin(); err != nil {
			// Half a pinned side must not stay behind to be adopted.
			b.pinned = true
			_ = b.Close() // the pin's error is the one to report
			return nil, fmt.Errorf("pin the kernel side at %s: %w", cfg.PinPath, err)
		}
	}
	return b, nil
}

// adoptLink takes over the pinned link of def's program, if there is one.
func (p *pinnedSide) adoptLink(def hookDef) (link.Link, bool) {
	if p == nil {
		return nil, false
	}
	l, ok := p.links[def.program]
	if ok {
		delete(p.links, def.program)
	}
	return l, ok
}

// installFlowMaps puts the two flow maps in their slots and makes
// programs count interval 1 (into map 1).
func (b *Bundler) installFlowMaps() error {
	for i, m := range b.inner {
		if err := b.flows.Put(uint32(i), m); err != nil {
			return fmt.Errorf("install bundled-flow map: %w", err)
		}
	}
	if err := b.setInterval(1); err != nil {
		return err
	}
	b.active = 1
	return nil
}

// findActive learns which flow map an adopted side counts into, and checks
// that each of its slots holds its own pinned map.
func (b *Bundler) findActive() error {
	for i, m := range b.inner {
		var slot *ebpf.Map
		if err := b.flows.Lookup(uint32(i), &slot); err != nil {
			return fmt.Errorf("read the adopted side's bundled-flow map %d: %w", i, err)
		}
		same := sameMap(slot, m)
		slot.Close()
		if !same {
			return fmt.Errorf("the adopted side's bundled-flow slot %d does not hold its pinned map", i)
		}
	}
	n, err := b.intervalNow()
	if err != nil {
		return err
	}
	b.active = int(n & 1)
	return nil
}

// sameMap reports whether a and b are the same kernel map.
func sameMap(a, b *ebpf.Map) bool {
	ai, err := a.Info()
	if err != nil {
		return false
	}
	bi, err := b.Info()
	if err != nil {
		return false
	}
	aid, aok := ai.ID()
	bid, bok := bi.ID()
	return aok && bok && aid == bid
}

// Adoption says what Load found under the pin path.
func (b *Bundler) Adoption() AdoptReport { return b.adopt }

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
	prog, reason, log := b.loadProgram(spec, def.program, def.kind)
	if prog == nil {
		return reason, log
	}
	b.programs[def.program] = prog

	switch def.kind {
	case kindTracepoint, kindFexit:
		if def.program == "on_unix_dgram_send_fexit" && b.HookActive("on_send") {
			// Only the datagrams sent to a path: sock_send_length counts the rest.
			if err := b.objs.SendTracepointOn.Set(uint32(1)); err != nil {
				return fmt.Sprintf("set send_tracepoint_on: %v", err), ""
			}
		}
		at := ebpf.AttachTraceRawTp
		if def.kind == kindFexit {
			at = ebpf.AttachTraceFExit
		}
		l, err := link.AttachTracing(link.TracingOptions{Program: prog, AttachType: at})
		if err != nil {
			return fmt.Sprintf("attach: %v", err), ""
		}
		b.links = append(b.links, l)
		b.linkOf[def.program] = l
		b.attachCopies(spec, def)
		if bit, ok := connectFexitBits[def.program]; ok {
			if err := b.markConnectFexit(bit); err != nil {
				return err.Error(), ""
			}
		}
	case kindSyscall:
		if err := kernel.MountTracefs(); err != nil {
			return err.Error(), ""
		}
		group, name, _ := strings.Cut(strings.TrimPrefix(def.hook, "tracepoint/"), "/")
		l, err := link.Tracepoint(group, name, prog, nil)
		if err != nil {
			return fmt.Sprintf("attach: %v", err), ""
		}
		b.links = append(b.links, l)
		b.linkOf[def.program] = l
	case kindCgroup:
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: def.attach, Program: prog})
		if err != nil {
			return fmt.Sprintf("attach to %s: %v", cgroupRoot, err), ""
		}
		b.links = append(b.links, l)
		b.linkOf[def.program] = l
	case kindIter:
		it, err := link.AttachIter(link.IterOptions{Program: prog})
		if err != nil {
			return fmt.Sprintf("attach: %v", err), ""
		}
		b.iters[def.program] = it
	case kindStorageIter:
		it, err := link.AttachIter(link.IterOptions{Program: prog, Map: b.objs.Socks})
		if err != nil {
			return fmt.Sprintf("attach: %v", err), ""
		}
		b.iters[def.program] = it
	}
	return "", ""
}

// loadProgram loads one program of spec, with the shared maps; on failure
// it returns why, and the verifier's full log when the verifier refused.
func (b *Bundler) loadProgram(spec *ebpf.CollectionSpec, program string, kind hookKind) (prog *ebpf.Program, reason, log string) {
	one := spec.Copy()
	for name := range one.Programs {
		if name != program {
			delete(one.Programs, name)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{MapReplacements: b.shared.Maps})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			full := fmt.Sprintf("%+v", ve)
			if why := kernel.TooOld(full); why != "" {
				return nil, why, full
			}
			last := ""
			if n := len(ve.Log); n > 0 {
				last = ve.Log[n-1]
			}
			return nil, fmt.Sprintf("verifier rejected %s (%s); deptrace doctor prints the full log", program, last), full
		}
		if kind == kindFexit && errors.Is(err, unix.EPERM) {
			return nil, "this kernel does not permit fexit programs (EPERM at load)", ""
		}
		return nil, fmt.Sprintf("load: %v", err), ""
	}
	prog = coll.DetachProgram(program)
	coll.Close()
	return prog, "", ""
}

// DNSCallHooks returns the program arrays the tracer's send and receive
// tracepoint programs tail-call into for a call on a possible resolver's
// socket (bpf/bundler.bpf.c, dns_hand_off): where the DNS watcher puts its
// per-call programs; and dests, the socket storage where the tracer's
// sendmsg programs note a sendto() to port 53 (bpf/udp.bpf.h, note_dns),
// which the watcher's programs read. ok is false when any of these
// programs is not attached (kernels before 6.3 count sends and receives
// at function exits); dests is nil only when the sendmsg programs are
// not, and is given without ok too: the watcher's per-packet programs
// read the notes as well.
func (b *Bundler) DNSCallHooks() (send, recv, dests *ebpf.Map, ok bool) {
	if !b.HookActive("udp_sendmsg4") || !b.HookActive("udp_sendmsg6") {
		return nil, nil, nil, false
	}
	if !b.HookActive("on_send") || !b.HookActive("on_recv") {
		return nil, nil, b.objs.DnsDests, false
	}
	return b.objs.DnsSendCalls, b.objs.DnsRecvCalls, b.objs.DnsDests, true
}

// clearDNSCalls empties the DNS watcher's program arrays.
func (b *Bundler) clearDNSCalls() error {
	for _, m := range []*ebpf.Map{b.objs.DnsSendCalls, b.objs.DnsRecvCalls} {
		if err := m.Delete(uint32(0)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clear the adopted side's DNS program array %s: %w", m, err)
		}
	}
	return nil
}

// Hooks lists every hook with its state on this kernel.
func (b *Bundler) Hooks() []Hook { return append([]Hook(nil), b.hooks...) }

func hasFallback(program string) bool {
	for _, d := range hookDefs {
		if slices.Contains(strings.Split(d.fallbackFor, ","), program) {
			return true
		}
	}
	return false
}

// replaced reports whether a fallback for program is active.
func (b *Bundler) replaced(program string) bool {
	for _, h := range b.hooks {
		if h.Active && slices.Contains(strings.Split(h.Replaces, ","), program) {
			return true
		}
	}
	return false
}

// connectFexitBits: the connect fexits, as connect_fexits in the kernel
// side knows them (the syscall tracepoint skips what they count).
var connectFexitBits = map[string]uint32{
	"on_unix_connect_fexit":       1,
	"on_unix_dgram_connect_fexit": 2,
	"on_inet_connect_fexit":       4,
}

func (b *Bundler) markConnectFexit(bit uint32) error {
	v := b.objs.ConnectFexits
	var cur uint32
	if err := v.Get(&cur); err != nil {
		return fmt.Errorf("read connect_fexits: %w", err)
	}
	if err := v.Set(cur | bit); err != nil {
		return fmt.Errorf("set connect_fexits: %w", err)
	}
	return nil
}

// allActive reports whether every program of a comma-separated list runs.
func (b *Bundler) allActive(programs string) bool {
	for _, p := range strings.Split(programs, ",") {
		if !b.HookActive(p) {
			return false
		}
	}
	return true
}

// HookActive reports whether the named program runs on this kernel.
func (b *Bundler) HookActive(program string) bool {
	for _, h := range b.hooks {
		if h.Program == program {
			return h.Active
		}
	}
	return false
}

// Close detaches and frees everything, pins included. Safe to call more
// than once.
func (b *Bundler) Close() error {
	var err error
	if b.pinned {
		for _, l := range b.links {
			_ = l.Unpin() // removePinned removes what is left in the pin directory and reports it
		}
		err = removePinned(b.cfg.PinPath, nil)
		b.pinned = false
	}
	b.Release()
	return err
}

// Release closes this process's handles but leaves a pinned kernel side
// attached and counting, for the next agent to adopt (--keep-tracing).
// Without pins it is Close.
func (b *Bundler) Release() {
	b.pinAfterSeed = false // nothing left to pin
	for _, l := range b.links {
		l.Close()
	}
	b.links = nil
	b.linkOf = map[string]link.Link{}
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
		b.objs = sharedObjects{}
	}
	b.lock.release()
	b.lock = nil
}

package bundler

import (
	"fmt"
	"strings"
	"time"
)

// Stats are the kernel side's loss counters (cumulative since Load) and
// per-program statistics.
type Stats struct {
	FlowMapFull       uint64 // counts lost: bundled-flow map full
	FlowAllocFailed   uint64 // counts lost: a flow entry could not be allocated
	PortMapFull       uint64 // listening ports not tracked: port table full
	UDPPeerUnknown    uint64 // UDP datagrams on unconnected sockets with no peer seen
	SockStorageFailed uint64 // sockets whose storage could not be created: their counts lost
	// RecursionMisses are the runs the kernel skipped (nested on one
	// CPU) that no copy did in their place (see recursionLost).
	RecursionMisses uint64
	// RecursionRecovered are skipped runs a later copy did instead.
	RecursionRecovered uint64
	Programs           map[string]ProgramStats
}

// ProgramStats are per-program run count and run time; RunTime and
// RunCount only grow while kernel.bpf_stats_enabled is on.
type ProgramStats struct {
	RunCount        uint64
	RunTime         time.Duration
	RecursionMisses uint64
}

// Stats reads the loss counters and every program's statistics.
func (b *Bundler) Stats() (Stats, error) {
	var s Stats
	m := b.objs.Stats
	vals := make([]uint64, b.ncpu)
	for _, c := range []struct {
		idx bundlerStatIndex
		dst *uint64
	}{
		{bundlerStatIndexSTAT_FLOW_MAP_FULL, &s.FlowMapFull},
		{bundlerStatIndexSTAT_FLOW_ALLOC_FAILED, &s.FlowAllocFailed},
		{bundlerStatIndexSTAT_PORT_MAP_FULL, &s.PortMapFull},
		{bundlerStatIndexSTAT_UDP_PEER_UNKNOWN, &s.UDPPeerUnknown},
		{bundlerStatIndexSTAT_SOCK_STORAGE_FAILED, &s.SockStorageFailed},
	} {
		if err := m.Lookup(uint32(c.idx), &vals); err != nil {
			return s, fmt.Errorf("read loss counter %d: %w", c.idx, err)
		}
		for _, v := range vals {
			*c.dst += v
		}
	}
	// The copies' rescues first, then their deferrals, then the
	// programs' misses: a skipped or deferred run's miss or deferral
	// comes before its rescue, so a run skipped and rescued between two
	// reads in that order counts as lost until the next read, never as a
	// rescue without its miss, which would hide a real loss.
	type copyCounts struct{ rescued, deferred uint64 }
	counts := map[string]copyCounts{}
	for name := range b.programs {
		if isCopy(name) {
			continue
		}
		var cc copyCounts
		for _, c := range []struct {
			idx bundlerStatIndex
			dst *uint64
		}{{copyRescued[name], &cc.rescued}, {copyDeferred[name], &cc.deferred}} {
			if c.idx == 0 {
				continue // a program without copies
			}
			if err := m.Lookup(uint32(c.idx), &vals); err != nil {
				return s, fmt.Errorf("read copy counter %d: %w", c.idx, err)
			}
			for _, v := range vals {
				*c.dst += v
			}
		}
		counts[name] = cc
	}
	s.Programs = map[string]ProgramStats{}
	for name, p := range b.programs {
		ps, err := p.Stats()
		if err != nil {
			return s, fmt.Errorf("read stats of %s: %w", name, err)
		}
		s.Programs[name] = ProgramStats{RunCount: ps.RunCount, RunTime: ps.Runtime, RecursionMisses: ps.RecursionMisses}
	}
	for name, cc := range counts {
		s.RecursionRecovered += cc.rescued
		s.RecursionMisses += b.recursionLost(name, s.Programs, cc.rescued, cc.deferred)
	}
	return s, nil
}

// isCopy reports whether a program is a copy of another (copies.go).
func isCopy(name string) bool {
	return strings.HasSuffix(name, "_last") || strings.Contains(name, "_mid")
}

// recursionLost is how many calls of program's tracepoint no copy did.
// The rescues and deferrals are read before the programs' misses (see
// Stats), so a run skipped meanwhile may count as lost until the next
// read, and no loss is ever hidden.
//   - without copies: the program's misses (and its deferrals, under
//     task marks);
//   - per-CPU flag: exactly the first copy's misses less the rescues (the
//     last copy counts every call it finds the flag raised in, before any
//     filter);
//   - task marks: a call is lost only if every copy skipped it (or the
//     first could not mark it), so at most the last copy's misses, and at
//     most the first copy's misses and deferrals less the rescues. Both
//     also count calls the filter drops: the smaller is an upper bound.
func (b *Bundler) recursionLost(program string, progs map[string]ProgramStats, rescued, deferred uint64) uint64 {
	copies := b.copies[program]
	first := progs[program].RecursionMisses
	// Calls the first copy deferred (task marks) are lost too when no
	// copy runs after it.
	byFirst := first + deferred - min(rescued, first+deferred)
	last := ""
	if n := len(copies); n > 0 {
		last = copies[n-1]
	}
	if !recTaskMarks() || !strings.HasSuffix(last, "_last") {
		// No last copy (a middle one may decline a call without a
		// miss): the first copy's figure only.
		return byFirst
	}
	return min(byFirst, progs[last].RecursionMisses)
}

// Port is one entry of the listening-port table.
type Port struct {
	NetNS uint32
	Proto uint8
	Port  uint16
	Refs  uint32
	PID   uint32
	Comm  string
}

// Ports lists the listening-port table.
func (b *Bundler) Ports() ([]Port, error) {
	var out []Port
	var k bundlerPortKey
	var v bundlerPortValue
	it := b.objs.Ports.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Port{NetNS: k.Netns, Proto: k.Proto, Port: k.Port, Refs: v.Refs, PID: v.Pid, Comm: commString(v.Comm)})
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("list listening ports: %w", err)
	}
	return out, nil
}

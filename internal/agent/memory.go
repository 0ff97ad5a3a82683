package agent

import (
	"runtime/debug"
	"strconv"

	"github.com/deptrace/deptrace/internal/bundler"
)

// GCPercent is the agent's garbage-collection target (Go's GOGC). The
// agent's heap is mostly an interval's flows, which die young: under
// short-lived TCP from 1,000 client hosts, 200 rather than Go's default
// of 100 takes about 6 % off the agent's CPU for about 11 MiB more
// resident memory (docs/performance.md). A soft memory limit keeps the
// ceiling: see gcTargets.
const GCPercent = 200

// memoryBase is MemoryCeiling's part that does not grow with flows or
// series: the Go runtime, SQLite and its prepared statements, the
// kernel's BTF and the BPF objects while they load.
const memoryBase = 96 << 20

// MemoryCeiling is docs/performance.md's bound on the agent's resident
// memory ("The ceiling"): memoryBase, plus per flow one interval can hold
// (the flow map, its spill and the per-CPU flow cache: what one drain
// reads and turns into flows and SQL, with the collector's headroom),
// plus per metric series (held, and gathered by a scrape). A flow's part
// does not grow with the CPUs: the flow map holds one value per flow, and
// the flow cache's slots on every CPU are counted as flows of their own.
func MemoryCeiling(flowMapSize uint32, cpus, series int) int64 {
	flows := int64(flowMapSize) + int64(bundler.SpillSlots(flowMapSize)) + int64(64*cpus)
	return memoryBase + flows*flowBytes + int64(series)*(7<<10)
}

// flowBytes is the ceiling's term per flow: 6.5 KiB.
const flowBytes = 13 << 9

// memoryBaseGo is the part of memoryBase that Go's runtime holds, which
// is what a Go memory limit counts: at idle, 52 MiB of the agent's 72 MiB
// resident (go_memstats_sys_bytes against process_resident_memory_bytes).
// The other 32 MiB are outside Go's heap: SQLite's (20 MiB at idle, and
// up to 12 MiB of row statements of some columns; internal/store).
const memoryBaseGo = 64 << 20

// edgeBytes is the ceiling's term per edge the edge cap holds.
const edgeBytes = 256

// gcTargets is the collector's target and soft memory limit for an agent
// whose flow map holds flowMapSize flows on cpus CPUs, whose metrics hold
// at most series series and which keeps at most bufferMax bytes of
// batches in memory (--buffer-max) unless its kernel side is pinned; -1
// leaves Go's own (set from GOGC and GOMEMLIMIT, which win when the
// environment gives them a value Go takes). The limit is the Go part of
// MemoryCeiling plus bufferMax, without the edges the cap holds
// (memoryLimit.follow adds them as they come): where GCPercent's headroom
// would take a hostile load past the ceiling, the runtime collects as
// often as the limit needs instead.
func gcTargets(flowMapSize uint32, cpus, series int, bufferMax int64, pinned bool, lookupEnv func(string) (string, bool)) (percent int, limit int64) {
	percent, limit = -1, -1
	if !goTakes(lookupEnv, "GOGC") {
		percent = GCPercent
	}
	if !goTakes(lookupEnv, "GOMEMLIMIT") {
		limit = SoftMemoryLimit(flowMapSize, cpus, series, bufferMax, pinned)
	}
	return percent, limit
}

// goTakes is whether the environment sets the Go runtime variable name to
// a value the runtime uses: it takes an empty GOGC or GOMEMLIMIT, or a
// GOGC it cannot read, as unset (and stops at a malformed GOMEMLIMIT before
// the agent starts); it ignores a GOMAXPROCS that is not a positive
// 32-bit integer.
func goTakes(lookupEnv func(string) (string, bool), name string) bool {
	v, set := lookupEnv(name)
	if !set || v == "" {
		return false
	}
	switch name {
	case "GOGC":
		if v == "off" {
			return true
		}
		_, err := strconv.ParseInt(v, 10, 32)
		return err == nil
	case "GOMAXPROCS":
		n, err := strconv.ParseInt(v, 10, 32)
		return err == nil && n > 0
	}
	return true
}

// SoftMemoryLimit is the agent's soft memory limit before it holds edges
// (see gcTargets).
func SoftMemoryLimit(flowMapSize uint32, cpus, series int, bufferMax int64, pinned bool) int64 {
	if pinned {
		bufferMax = 0 // batches wait in the kernel, not in memory
	}
	return MemoryCeiling(flowMapSize, cpus, series) - memoryBase + memoryBaseGo + max(bufferMax, 0)
}

// setGC applies gcTargets' values (-1: unchanged).
func setGC(percent int, limit int64) {
	if percent >= 0 {
		debug.SetGCPercent(percent)
	}
	if limit >= 0 {
		debug.SetMemoryLimit(limit)
	}
}

// memoryLimit keeps the soft memory limit in step with the ceiling's
// edges term.
type memoryLimit struct {
	base  int64 // gcTargets' limit; -1: GOMEMLIMIT's, left alone
	edges int   // the edges the limit set counts
}

// limitStep is the change in edges held (1 MiB of ceiling) that moves the
// limit.
const limitStep = 4096

// follow sets the limit for edges held, when they moved by limitStep
// since it last did; it returns the limit set, or -1.
func (l *memoryLimit) follow(edges int) int64 {
	if l.base < 0 || (edges-l.edges < limitStep && l.edges-edges < limitStep) {
		return -1
	}
	l.edges = edges
	limit := l.base + int64(edges)*edgeBytes
	debug.SetMemoryLimit(limit)
	return limit
}

// DefaultMaxProcs is the agent's GOMAXPROCS: its work is one pipeline (a
// drain, then the store's write through SQLite's one connection), which a
// second processor does not speed up, while waking it costs switches
// between threads; at 1, the agent with 1,000 client hosts took about
// 8 % less CPU (docs/performance.md). It also keeps the agent's Go code
// to one CPU's worth on a busy host. node_exporter does the same.
const DefaultMaxProcs = 1

// maxProcs is the GOMAXPROCS to set for want (the --gomaxprocs flag), or
// 0 to leave Go's: when want is 0 or the environment sets GOMAXPROCS to
// a value Go takes.
func maxProcs(want int, lookupEnv func(string) (string, bool)) int {
	if goTakes(lookupEnv, "GOMAXPROCS") {
		return 0
	}
	return max(want, 0)
}

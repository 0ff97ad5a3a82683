package measure

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// floorProbe is an empty program ("return 0") attached beside deptrace's
// own on the busiest tracepoint. With bpf_stats on, its average run time is
// what the measurement itself costs per run (two clock reads; about 50 ns
// on this project's VMs, where rdtsc is slow), so deptrace's programs can be
// reported both as measured and net of that floor.
type floorProbe struct {
	prog *ebpf.Program
	link link.Link
}

func attachFloorProbe(tracepoint string) (*floorProbe, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:       "floor_probe",
		Type:       ebpf.Tracing,
		AttachType: ebpf.AttachTraceRawTp,
		AttachTo:   tracepoint,
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("load floor probe: %w", err)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceRawTp})
	if err != nil {
		prog.Close()
		return nil, fmt.Errorf("attach floor probe to %s: %w", tracepoint, err)
	}
	return &floorProbe{prog: prog, link: l}, nil
}

func (f *floorProbe) stats() (runs uint64, ns uint64, err error) {
	s, err := f.prog.Stats()
	if err != nil {
		return 0, 0, err
	}
	return s.RunCount, uint64(s.Runtime), nil
}

func (f *floorProbe) Close() {
	f.link.Close()
	f.prog.Close()
}

// hollowSets are the hook sets whose floor --hollow measures, by name:
// today's, and the alternatives for TCP that issue 21 weighs. Each is
// derived from the hooks deptrace runs per event on this kernel (today),
// so UDP and unix keep whatever this kernel gives them.
var hollowSets = map[string]func(today []string) []string{
	// What deptrace attaches today, one program per hook.
	"deptrace": func(today []string) []string { return today },
	// With the second copy of the state program deptrace attaches against
	// recursion (on_tcp_state_last; 6.19 and later attach a third).
	"deptrace+copies": func(today []string) []string {
		return append(slices.Clone(today), tcpStateHook)
	},
	// sockops in place of the state tracepoint: the callbacks every TCP
	// socket gets, nothing enabled.
	"sockops": func(today []string) []string { return swapStateHook(today, "cgroup/sockops") },
	// sockops with the state callback from connect() until the open.
	"sockops+state-connecting": func(today []string) []string {
		return swapStateHook(today, "cgroup/sockops+state-connecting")
	},
	// The same without cgroup/getsockopt (the state callback while
	// connecting sees a failed connect's error before SO_ERROR clears it).
	"sockops+state-connecting-no-getsockopt": func(today []string) []string {
		return slices.DeleteFunc(swapStateHook(today, "cgroup/sockops+state-connecting"), func(h string) bool { return h == "cgroup/getsockopt" })
	},
	// sockops with the state callback on for the socket's whole life.
	"sockops+state": func(today []string) []string { return swapStateHook(today, "cgroup/sockops+state") },
}

const tcpStateHook = "tp_btf/inet_sock_set_state"

// swapStateHook replaces the TCP state tracepoint by hook; the final
// counters of a connection then come from cgroup/sock_release, which
// today's set has already (for UDP).
func swapStateHook(today []string, hook string) []string {
	out := slices.DeleteFunc(slices.Clone(today), func(h string) bool { return h == tcpStateHook })
	out = append(out, hook)
	if !slices.Contains(out, "cgroup/sock_release") {
		out = append(out, "cgroup/sock_release")
	}
	return out
}

// HollowSetNames lists the hook sets --hollow-set accepts.
func HollowSetNames() []string { return slices.Sorted(maps.Keys(hollowSets)) }

// HollowSetHooks is the hook set named name on this kernel.
func HollowSetHooks(name string) ([]string, error) {
	set, ok := hollowSets[name]
	if !ok {
		return nil, fmt.Errorf("unknown hook set %q: allowed %s", name, strings.Join(HollowSetNames(), ", "))
	}
	today, err := perEventHooks()
	if err != nil {
		return nil, err
	}
	return set(today), nil
}

// hollowSetOf is the hook set named name, given today's hooks (one
// tracer load for every set).
func hollowSetOf(name string, today []string) []string { return hollowSets[name](today) }

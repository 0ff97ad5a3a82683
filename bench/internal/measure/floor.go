package measure

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// floorProbe is an empty program ("return 0") attached beside the measured
// programs where every load's round trips run it. With bpf_stats on, its
// average run time is what the measurement itself costs per run: two clock
// reads (about 50 ns on this project's VMs, where rdtsc is slow) and the
// call into the program, which runs with bpf_stats off too, so the net
// figures understate by that call (a few ns per run). The measured
// programs are reported both as measured and net of that floor.
type floorProbe struct {
	hook     string // as hollowSpec names it
	prog     *ebpf.Program
	link     link.Link
	runs, ns uint64 // the counters at start
}

// floorHooks are tried in order: the receive tracepoint (6.3 and later),
// then the exit of sock_recvmsg, where deptrace's own fallback counts
// receives before 6.3. Every load's round trips receive.
var floorHooks = []string{"tp_btf/sock_recv_length", "fexit/sock_recvmsg"}

// attachFloorProbe attaches the probe at the first of floorHooks this
// kernel allows.
func attachFloorProbe() (*floorProbe, error) {
	var errs []error
	for _, h := range floorHooks {
		f, err := attachFloorProbeAt(h)
		if err == nil {
			return f, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// attachFloorProbeAt attaches the probe, the hollow side's empty tracing
// program (hollowSpec), at hook.
func attachFloorProbeAt(hook string) (*floorProbe, error) {
	spec, err := hollowSpec(hook)
	if err != nil {
		return nil, err
	}
	spec.Name = "floor_probe"
	prog, err := ebpf.NewProgram(spec)
	if err != nil {
		return nil, fmt.Errorf("load floor probe for %s: %w", hook, err)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: prog, AttachType: spec.AttachType})
	if err != nil {
		prog.Close()
		return nil, fmt.Errorf("attach floor probe to %s: %w", hook, err)
	}
	return &floorProbe{hook: hook, prog: prog, link: l}, nil
}

// start takes the probe's counters as the base of nsPerRun.
func (f *floorProbe) start() error {
	s, err := f.prog.Stats()
	if err != nil {
		return fmt.Errorf("read the floor probe's stats: %w", err)
	}
	f.runs, f.ns = s.RunCount, uint64(s.Runtime)
	return nil
}

// nsPerRun is the probe's average run time since start, 0 if it has not
// run since (or bpf_stats was off).
func (f *floorProbe) nsPerRun() (float64, error) {
	s, err := f.prog.Stats()
	if err != nil {
		return 0, fmt.Errorf("read the floor probe's stats: %w", err)
	}
	runs, ns := s.RunCount-f.runs, uint64(s.Runtime)-f.ns
	if runs == 0 {
		return 0, nil
	}
	return float64(ns) / float64(runs), nil
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
	// sockops with the state callback while connecting, and the final
	// counters from tcp_destroy_sock, which runs once per full socket when
	// it is freed, after every byte and retransmission: the close that
	// cgroup/sock_release cannot give. Two programs there, as deptrace
	// would need: the tracepoint can run in process context with softirqs
	// on (a dead socket's backlog processed by release_sock), where the
	// first program's recursion guard would hide a nested destroy.
	"sockops+state-connecting+destroy": func(today []string) []string {
		return append(swapStateHook(today, "cgroup/sockops+state-connecting"), tcpDestroyHook, tcpDestroyHook)
	},
}

const (
	tcpStateHook   = "tp_btf/inet_sock_set_state"
	tcpDestroyHook = "tp_btf/tcp_destroy_sock"
)

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

package measure

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/tracer"
)

// Hollow is the kernel's floor for deptrace's design: one empty program
// on every hook deptrace runs on this kernel, and nothing else (no maps,
// no drain, no agent). Measured in place of deptrace in the paired runs,
// it is what any program on these hooks costs before it does any work:
// the tracepoint's or trampoline's dispatch and the cgroup hooks' run. A
// cost target below it cannot be met by leaner programs, only by other
// hooks.
//
// One program per hook: deptrace attaches copies on some (recmarks.h),
// and the iterators, which run at each drain, are left out; so this is a
// lower bound of what deptrace's hooks cost, not an estimate of it.
type Hollow struct {
	Hooks []string // where the empty programs run, as doctor names them
	progs []*ebpf.Program
	links []link.Link
}

// errNotPerEvent marks the hooks that do not run per socket event.
var errNotPerEvent = errors.New("runs on demand, not per event")

// cgroupHooks are the program and attach types of deptrace's cgroup hooks.
var cgroupHooks = map[string]struct {
	prog   ebpf.ProgramType
	attach ebpf.AttachType
}{
	"getsockopt":   {ebpf.CGroupSockopt, ebpf.AttachCGroupGetsockopt},
	"sendmsg4":     {ebpf.CGroupSockAddr, ebpf.AttachCGroupUDP4Sendmsg},
	"sendmsg6":     {ebpf.CGroupSockAddr, ebpf.AttachCGroupUDP6Sendmsg},
	"recvmsg4":     {ebpf.CGroupSockAddr, ebpf.AttachCGroupUDP4Recvmsg},
	"recvmsg6":     {ebpf.CGroupSockAddr, ebpf.AttachCGroupUDP6Recvmsg},
	"sendmsg_unix": {ebpf.CGroupSockAddr, ebpf.AttachCgroupUnixSendmsg},
	"sock_release": {ebpf.CGroupSock, ebpf.AttachCgroupInetSockRelease},
	"sock_create":  {ebpf.CGroupSock, ebpf.AttachCGroupInetSockCreate},
	"post_bind4":   {ebpf.CGroupSock, ebpf.AttachCGroupInet4PostBind},
	"post_bind6":   {ebpf.CGroupSock, ebpf.AttachCGroupInet6PostBind},
	// The sockops variants below: every one is a sockops program on the
	// root cgroup; they differ in the callbacks they enable per socket.
	"sockops":                  {ebpf.SockOps, ebpf.AttachCGroupSockOps},
	"sockops+state-connecting": {ebpf.SockOps, ebpf.AttachCGroupSockOps},
	"sockops+state":            {ebpf.SockOps, ebpf.AttachCGroupSockOps},
}

// The sockops operations and callback flags the hollow sockops programs
// use (include/uapi/linux/bpf.h).
const (
	sockOpsConnectCB            = 3
	sockOpsActiveEstablishedCB  = 4
	sockOpsPassiveEstablishedCB = 5
	sockOpsStateCBFlag          = 4
)

// sockOpsProgram is the least a sockops program must do to see what
// deptrace needs of a TCP connection: its connect and its open (the
// established callbacks run whatever the flags), and where the state
// callback is wanted, enable it per socket (bpf_sock_ops_cb_flags_set):
// from the connect until the open ("+state-connecting": a refused or
// timed-out connect is then seen at SYN_SENT -> CLOSE with its sk_err),
// or from the connect and from a server's open on ("+state": every later
// state change, the close included, calls it). The plain variant enables
// nothing: the callbacks every socket gets (TIMEOUT_INIT, RWND_INIT,
// NEEDS_ECN, the connect and the established ones). bpf_sock_ops.op is
// at offset 0; the program returns 1.
func sockOpsProgram(variant string) asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word),
	}
	setFlags := func(label string, flags int32) asm.Instructions {
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, asm.R6).WithSymbol(label),
			asm.Mov.Imm(asm.R2, flags),
			asm.FnSockOpsCbFlagsSet.Call(),
			asm.Ja.Label("out"),
		}
	}
	switch variant {
	case "sockops+state-connecting":
		insns = append(insns,
			asm.JEq.Imm(asm.R2, sockOpsConnectCB, "on"),
			asm.JEq.Imm(asm.R2, sockOpsActiveEstablishedCB, "off"),
			asm.Ja.Label("out"))
		insns = append(insns, setFlags("on", sockOpsStateCBFlag)...)
		insns = append(insns, setFlags("off", 0)...)
	case "sockops+state":
		insns = append(insns,
			asm.JEq.Imm(asm.R2, sockOpsConnectCB, "on"),
			asm.JEq.Imm(asm.R2, sockOpsPassiveEstablishedCB, "on"),
			asm.Ja.Label("out"))
		insns = append(insns, setFlags("on", sockOpsStateCBFlag)...)
	}
	return append(insns, asm.Mov.Imm(asm.R0, 1).WithSymbol("out"), asm.Return())
}

// getsockoptGuard is the least a getsockopt program must do: kernels
// before 6.5 fail a getsockopt whose value exceeds a page unless the
// program hands the buffer back (optlen 0), as deptrace's connect_error
// does first thing. (bpf_sockopt.optlen is at offset 32.)
var getsockoptGuard = asm.Instructions{
	asm.LoadMem(asm.R2, asm.R1, 32, asm.Word),
	asm.JSLE.Imm(asm.R2, 4096, "allow"),
	asm.Mov.Imm(asm.R3, 0),
	asm.StoreMem(asm.R1, 32, asm.R3, asm.Word),
	asm.Mov.Imm(asm.R0, 1).WithSymbol("allow"),
	asm.Return(),
}

// hollowSpec is the empty program for one of deptrace's hooks, as doctor
// names it ("tp_btf/sock_send_length", "cgroup/sendmsg4", ...).
func hollowSpec(hook string) (*ebpf.ProgramSpec, error) {
	kind, target, ok := strings.Cut(hook, "/")
	if !ok || target == "" {
		return nil, fmt.Errorf("hook %q: want kind/target (tp_btf, fexit, tracepoint, iter or cgroup)", hook)
	}
	spec := &ebpf.ProgramSpec{
		Name:    "hollow",
		License: "GPL",
		// Tracing programs return 0; cgroup programs return 1, "allow":
		// the hollow side must not change what any socket call does.
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	}
	allow := asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}
	switch kind {
	case "tp_btf":
		spec.Type, spec.AttachType, spec.AttachTo = ebpf.Tracing, ebpf.AttachTraceRawTp, target
	case "fexit":
		spec.Type, spec.AttachType, spec.AttachTo = ebpf.Tracing, ebpf.AttachTraceFExit, target
	case "tracepoint":
		spec.Type, spec.AttachTo = ebpf.TracePoint, target
	case "iter":
		return nil, errNotPerEvent
	case "cgroup":
		spec.Instructions = allow
		t, ok := cgroupHooks[target]
		if !ok {
			return nil, fmt.Errorf("hook %q: no empty program for this cgroup hook (allowed: %s)", hook, strings.Join(slices.Sorted(maps.Keys(cgroupHooks)), ", "))
		}
		spec.Type, spec.AttachType = t.prog, t.attach
		switch {
		case target == "getsockopt":
			spec.Instructions = getsockoptGuard
		case t.prog == ebpf.SockOps:
			spec.Instructions = sockOpsProgram(target)
		}
	default:
		return nil, fmt.Errorf("hook %q: no empty program for hooks of kind %q (allowed: tp_btf, fexit, tracepoint, iter, cgroup)", hook, kind)
	}
	return spec, nil
}

// perEventHooks lists the hooks deptrace's default tracer runs per event
// on this kernel, one entry each, by loading it and closing it again.
func perEventHooks() ([]string, error) {
	t, err := tracer.New(tracer.DefaultConfig())
	if err != nil {
		return nil, fmt.Errorf("load tracer to list its hooks: %w", err)
	}
	defer func() { _ = t.Close() }() // the measurement is taken; nothing to report
	var hooks []string
	for _, h := range t.Hooks() {
		if !h.Active || strings.HasPrefix(h.Hook, "iter/") {
			continue
		}
		hooks = append(hooks, h.Hook)
	}
	return hooks, nil
}

// AttachHollow attaches one empty program to each of hooks.
func AttachHollow(hooks []string) (*Hollow, error) {
	h := &Hollow{}
	cgroupRoot, cgroupErr := "", error(nil)
	for _, hook := range hooks {
		spec, err := hollowSpec(hook)
		if errors.Is(err, errNotPerEvent) {
			continue
		}
		if err != nil {
			h.Close()
			return nil, err
		}
		prog, err := ebpf.NewProgram(spec)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("load empty program for %s: %w", hook, err)
		}
		h.progs = append(h.progs, prog)
		var l link.Link
		switch spec.Type {
		case ebpf.Tracing:
			l, err = link.AttachTracing(link.TracingOptions{Program: prog, AttachType: spec.AttachType})
		case ebpf.TracePoint:
			group, name, _ := strings.Cut(spec.AttachTo, "/")
			l, err = link.Tracepoint(group, name, prog, nil)
		default:
			if cgroupRoot == "" && cgroupErr == nil {
				cgroupRoot, cgroupErr = kernel.CgroupV2Root()
			}
			if cgroupErr != nil {
				err = cgroupErr
				break
			}
			l, err = link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: spec.AttachType, Program: prog})
		}
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("attach empty program to %s: %w", hook, err)
		}
		h.links = append(h.links, l)
		h.Hooks = append(h.Hooks, hook)
	}
	return h, nil
}

// Runs is how many times the empty program on hook ran, while bpf_stats
// is on (0 while it is off).
func (h *Hollow) Runs(hook string) (uint64, error) {
	for i, name := range h.Hooks {
		if name != hook {
			continue
		}
		s, err := h.progs[i].Stats()
		if err != nil {
			return 0, err
		}
		return s.RunCount, nil
	}
	return 0, fmt.Errorf("no empty program on %s", hook)
}

// Stats is each empty program's run count and run time (ns), in the
// order of h.Hooks, while bpf_stats is on.
func (h *Hollow) Stats() (runs, ns []uint64, err error) {
	for _, p := range h.progs {
		s, err := p.Stats()
		if err != nil {
			return nil, nil, err
		}
		runs = append(runs, s.RunCount)
		ns = append(ns, uint64(s.Runtime))
	}
	return runs, ns, nil
}

// Close detaches and frees every empty program.
func (h *Hollow) Close() {
	for _, l := range h.links {
		l.Close()
	}
	for _, p := range h.progs {
		p.Close()
	}
	h.links, h.progs, h.Hooks = nil, nil, nil
}

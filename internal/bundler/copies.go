package bundler

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/deptrace/deptrace/internal/kernel"
)

// Copies of the hot tracepoint programs recover the runs the kernel skips
// for recursion: see "Runs the kernel skips" in bpf/bundler.bpf.c, and
// docs/design.md. The first copy is the program itself; the copies are
// attached after it, in order, to the same tracepoint.

type copyPolicy int

const (
	copiesNone        copyPolicy = iota
	copiesAlways                 // a softirq can nest in the program on any kernel
	copiesPreemptible            // only where tracepoint programs are preemptible (6.19+)
)

// copyRescued is the kernel side's count of the runs each program's later
// copies did in its place.
var copyRescued = map[string]bundlerStatIndex{
	"on_tcp_state": bundlerStatIndexSTAT_REC_RESCUED_STATE,
	"on_send":      bundlerStatIndexSTAT_REC_RESCUED_SEND,
	"on_recv":      bundlerStatIndexSTAT_REC_RESCUED_RECV,
}

// copyDeferred counts the calls each program's first copy left to the
// later ones (task marks only).
var copyDeferred = map[string]bundlerStatIndex{
	"on_tcp_state": bundlerStatIndexSTAT_REC_DEFERRED_STATE,
	"on_send":      bundlerStatIndexSTAT_REC_DEFERRED_SEND,
	"on_recv":      bundlerStatIndexSTAT_REC_DEFERRED_RECV,
}

// recMidCopies is how many middle copies marks mode attaches (3 copies in
// all): in the 7.3 guest's stress test 3 copies lost 0-0.05 % of TCP state
// changes and 0.1-3 % of sends, 2 copies 0.2-0.4 % and 2-8 %, and each
// copy costs a program run on every call (docs/install.md).
const recMidCopies = 1

// recTaskMarks says whether the copies decide by task-local marks, where
// tracepoint programs are preemptible (6.19+: a task can be preempted
// inside a program, or between two copies, and move to another CPU), or
// by the first copy's per-CPU flag, exact where a tracepoint call runs its
// programs with preemption off.
func recTaskMarks() bool {
	return testHooks.recMarks || kernel.ReleaseAtLeast(6, 19)
}

// TaskMarks reports whether the kernel side decides by task marks on this
// kernel (recTaskMarks): there a call every copy of a program skipped is
// lost, and counted in Stats().RecursionMisses; with the per-CPU flag no
// call of a process can be lost that way.
func TaskMarks() bool { return recTaskMarks() }

func boolU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// copyNames lists the copies def's program gets on this kernel, in attach
// order (the object's program each is loaded from: copySource).
func copyNames(def hookDef, marks bool) []string {
	if def.copies == copiesNone || (def.copies == copiesPreemptible && !marks) {
		return nil
	}
	var names []string
	if marks {
		for i := 1; i <= recMidCopies; i++ {
			names = append(names, def.program+"_mid"+strconv.Itoa(i))
		}
	}
	return append(names, def.program+"_last")
}

// copySource is the object's program a copy is loaded from: every middle
// copy is a separate load of the one middle program (a program of its own,
// with a recursion guard of its own).
func copySource(name string) string {
	if i := strings.LastIndex(name, "_mid"); i >= 0 {
		return name[:i+len("_mid")]
	}
	return name
}

// attachCopies loads and attaches def's copies after its program. Copies
// that cannot all run are all detached: the program then runs alone, as on
// a kernel without copies, and its skipped runs count as lost.
func (b *Bundler) attachCopies(spec *ebpf.CollectionSpec, def hookDef) {
	names := copyNames(def, recTaskMarks())
	var attached []string
	for _, name := range names {
		prog, reason, _ := b.loadProgram(spec, copySource(name), def.kind)
		if prog == nil {
			b.dropCopies(def.program, attached, name+": "+reason)
			return
		}
		b.programs[name] = prog
		l, err := link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			b.dropCopies(def.program, append(attached, name), fmt.Sprintf("%s: attach: %v", name, err))
			return
		}
		b.links = append(b.links, l)
		b.linkOf[name] = l
		attached = append(attached, name)
	}
	if len(attached) > 0 {
		b.copies[def.program] = attached
	}
}

// dropCopies detaches and unloads the copies of program attached so far.
func (b *Bundler) dropCopies(program string, names []string, why string) {
	for _, name := range names {
		if l, ok := b.linkOf[name]; ok {
			l.Close()
			delete(b.linkOf, name)
			for i, x := range b.links {
				if x == l {
					b.links = append(b.links[:i], b.links[i+1:]...)
					break
				}
			}
		}
		if p, ok := b.programs[name]; ok {
			p.Close()
			delete(b.programs, name)
		}
	}
	b.copyErr[program] = why
}

// adoptCopies takes over the pinned links of def's copies. The side's
// identity includes the copy mode (objectHash), so an adopted side has
// the copies this kernel gets, attached in order when it was pinned.
func (b *Bundler) adoptCopies(old *pinnedSide, def hookDef) {
	var adopted []string
	for _, name := range copyNames(def, recTaskMarks()) {
		l, ok := old.links[name]
		if !ok {
			continue
		}
		delete(old.links, name)
		b.links = append(b.links, l)
		b.linkOf[name] = l
		adopted = append(adopted, name)
	}
	if len(adopted) > 0 {
		b.copies[def.program] = adopted
	}
}

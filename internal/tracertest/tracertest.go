// Package tracertest is the harness of the privileged tests that run a
// tracer against real traffic: start one with its hook check, sum the
// intervals in a Ledger, collect until the counts settle, and wait for a
// condition with a bound. The tests of tracer, tests/realsoftware and
// others import it; internal/bundler's own tests cannot (this package
// imports tracer, which imports bundler) and use Eventually's sibling,
// package poll.
package tracertest

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/bundler"
	"github.com/deptrace/deptrace/internal/hooks"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest/poll"
	"github.com/deptrace/deptrace/tracer"
)

// Config is the configuration tests load: the defaults, with the connect
// system call's exit tracepoint allowed (the fallback the CI kernel needs
// for connect failures), changed by mutate when it is not nil.
func Config(mutate func(*tracer.Config)) tracer.Config {
	cfg := tracer.DefaultConfig()
	cfg.SyscallTracepoints = true
	if mutate != nil {
		mutate(&cfg)
	}
	return cfg
}

// Start loads a tracer with Config(mutate), checks it with Check, and
// closes it when the test ends. It skips without root on a laptop and
// fails under CI=true (testnet.RequireRoot).
func Start(t testing.TB, mutate func(*tracer.Config)) *tracer.Tracer {
	t.Helper()
	testnet.RequireRoot(t)
	tr, err := tracer.New(Config(mutate))
	if err != nil {
		t.Fatalf("load tracer: %v", err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	if err := Check(tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

// AbsentHooksEnv names (comma-separated) hooks Check lets be inactive and
// not replaced. Only the arm64 kernel matrix sets it, on 6.1 (no fexit
// there, no byte tracepoints before 6.3): the tests that need those hooks
// then fail on their own counts, expected failures it lists with the
// reason (scripts/kernel-matrix/arm64-expected), and the others run.
const AbsentHooksEnv = "DEPTRACE_TEST_ABSENT_HOOKS"

// Check fails a tracer on which a capability does not work, through its
// primary hook or a fallback (fexit where a tracepoint is missing): a test
// never passes because a hook is missing. Seeding must have worked too.
func Check(tr *tracer.Tracer) error {
	all := tr.Hooks()
	absent := strings.Split(os.Getenv(AbsentHooksEnv), ",")
	for _, h := range all {
		if !hooks.Covered(h, all) && !slices.Contains(absent, h.Hook) {
			return fmt.Errorf("hook %s inactive and not replaced on this kernel: %s", h.Hook, h.Reason)
		}
	}
	if _, _, err := tr.Seeded(); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

// Collect ends an interval, failing the test if the drain failed.
func Collect(t testing.TB, tr *tracer.Tracer) tracer.Interval {
	t.Helper()
	iv, err := tr.Collect()
	if err != nil {
		t.Fatalf("collect: %v", err)
	}
	return iv
}

// Ledger sums flows and listener records over many intervals, per
// namespace and flow identity. The kernel reports a connection's bytes
// when the socket counted them (sent bytes once acknowledged) and
// whatever is left at close, so exact totals are asserted over intervals,
// never what one interval holds: that would depend on how fast the
// machine is.
type Ledger struct {
	Flows     map[string]*tracer.Flow
	Listeners map[string]*tracer.Listener
	Lost      tracer.Losses
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{Flows: map[string]*tracer.Flow{}, Listeners: map[string]*tracer.Listener{}}
}

// FlowID is a flow's identity across intervals.
func FlowID(f tracer.Flow) string {
	return fmt.Sprint(f.NetNS, f.Proto, f.Direction, f.LocalAddr, f.RemoteAddr, f.Port)
}

// Add sums one interval in: counters, the last process names seen, the
// listeners' drops and deepest queue, the losses.
func (l *Ledger) Add(iv tracer.Interval) {
	for _, f := range iv.Flows {
		id := FlowID(f)
		if have, ok := l.Flows[id]; ok {
			have.Counters.Add(f.Counters)
			if f.PID != 0 {
				have.PID, have.Comm = f.PID, f.Comm
			}
			if f.PeerPID != 0 {
				have.PeerPID, have.PeerComm = f.PeerPID, f.PeerComm
			}
			continue
		}
		cp := f
		l.Flows[id] = &cp
	}
	for _, li := range iv.Listeners {
		id := fmt.Sprint(li.NetNS, li.Proto, li.LocalAddr, li.Port)
		have, ok := l.Listeners[id]
		if !ok {
			cp := li
			l.Listeners[id] = &cp
			continue
		}
		have.Drops += li.Drops
		have.QueueMax = max(have.QueueMax, li.QueueMax)
		have.BacklogLimit = li.BacklogLimit
		if li.PID != 0 {
			have.PID, have.Comm = li.PID, li.Comm
		}
	}
	l.Lost.FlowMapFull += iv.Lost.FlowMapFull
	l.Lost.FlowAllocFailed += iv.Lost.FlowAllocFailed
	l.Lost.PortMapFull += iv.Lost.PortMapFull
	l.Lost.UDPPeerUnknown += iv.Lost.UDPPeerUnknown
	l.Lost.SockStorageFailed += iv.Lost.SockStorageFailed
	l.Lost.RecursionMisses += iv.Lost.RecursionMisses
}

// Counted reports whether a count (connections, datagrams, resets...) is
// what the traffic did. From 6.19 tracepoint programs are preemptible and
// a call every copy of a program skipped is lost and counted
// (bpf/recmarks.h): on those kernels a count may fall short of the traffic
// by no more than the calls reported lost while this ledger collected
// (an upper bound: it counts calls of any socket of the machine). Never
// more than the traffic; before 6.19 (the per-CPU flag, whose losses
// cannot happen in these tests) exactly the traffic.
func (l *Ledger) Counted(got, want uint64) bool { return l.CountedBytes(got, want, 1) }

// CountedBytes is Counted for bytes, of which one lost call (a close
// folding a connection's counters, a datagram) loses at most per.
func (l *Ledger) CountedBytes(got, want, per uint64) bool {
	return got == want || got < want && want-got <= l.LossBudget()*per
}

// LossBudget is the calls this ledger's counts may be short by.
func (l *Ledger) LossBudget() uint64 {
	if !bundler.TaskMarks() {
		return 0
	}
	return l.Lost.RecursionMisses
}

// StreamLosses is every loss that could touch a TCP or unix count. The
// tracer sees the whole machine, where any daemon may read a datagram
// without asking its sender (udp_peer_unknown): no stream depends on that.
func (l *Ledger) StreamLosses() uint64 {
	lost := l.Lost
	lost.UDPPeerUnknown = 0
	return lost.Total()
}

// Of returns the flows of host h.
func (l *Ledger) Of(h *testnet.Host) []tracer.Flow {
	var out []tracer.Flow
	for _, f := range l.Flows {
		if f.NetNS == h.Inode {
			out = append(out, *f)
		}
	}
	return out
}

// One returns host h's single flow, or a zero flow if it has none yet.
func (l *Ledger) One(t testing.TB, h *testnet.Host) tracer.Flow {
	t.Helper()
	got := l.Of(h)
	if len(got) > 1 {
		t.Fatalf("host %s: want one flow, got %d: %+v", h.Name, len(got), got)
	}
	if len(got) == 0 {
		return tracer.Flow{}
	}
	return got[0]
}

// TCP returns the tcp flow of namespace ns in direction dir on server port
// port, or a zero flow.
func (l *Ledger) TCP(ns uint32, dir tracer.Direction, port uint16) tracer.Flow {
	for _, f := range l.Flows {
		if f.NetNS == ns && f.Proto == tracer.ProtoTCP && f.Direction == dir && f.Port == port {
			return *f
		}
	}
	return tracer.Flow{}
}

// CountTCP counts the tcp flows of namespace ns on server port port.
func (l *Ledger) CountTCP(ns uint32, port uint16) int {
	n := 0
	for _, f := range l.Flows {
		if f.NetNS == ns && f.Proto == tracer.ProtoTCP && f.Port == port {
			n++
		}
	}
	return n
}

// Unix returns the unix flows on socket path: the client's side
// (outbound, named by the server's path) and the server's (inbound).
func (l *Ledger) Unix(path string) (out, in tracer.Flow) {
	for _, f := range l.Flows {
		if f.Proto != tracer.ProtoUnix {
			continue
		}
		if f.Direction == tracer.Outbound && f.RemoteAddr == path {
			out = *f
		}
		if f.Direction == tracer.Inbound && f.LocalAddr == path {
			in = *f
		}
	}
	return out, in
}

// Listener returns the tcp listener of namespace ns on port, or a zero one.
func (l *Ledger) Listener(ns uint32, port uint16) tracer.Listener {
	for _, li := range l.Listeners {
		if li.NetNS == ns && li.Port == port && li.Proto == tracer.ProtoTCP {
			return *li
		}
	}
	return tracer.Listener{}
}

func (l *Ledger) String() string { return l.About(nil) }

// About lists the flows and listeners of the namespaces in ns (all when
// ns is nil): other tests' traffic on a shared machine is no evidence.
func (l *Ledger) About(ns []uint32) string {
	var b strings.Builder
	keep := func(n uint32) bool { return ns == nil || slices.Contains(ns, n) }
	for id, f := range l.Flows {
		if keep(f.NetNS) {
			fmt.Fprintf(&b, "\n  %s pid %d %q peer %d %q: %+v", id, f.PID, f.Comm, f.PeerPID, f.PeerComm, f.Counters)
		}
	}
	for id, li := range l.Listeners {
		if keep(li.NetNS) {
			fmt.Fprintf(&b, "\n  listener %s pid %d %q: backlog %d queue %d drops %d", id, li.PID, li.Comm, li.BacklogLimit, li.QueueMax, li.Drops)
		}
	}
	return b.String()
}

// SettleLimit bounds Settle: a stalled machine, not a slow one.
const SettleLimit = 20 * time.Second

// Settle sums intervals collected by next into l until done holds for it,
// then two more to catch anything counted twice. It fails after
// SettleLimit, unless calls were lost for recursion meanwhile (LossBudget):
// then it logs and returns, and the test's Counted checks decide whether
// the shortfall is within them.
func Settle(t testing.TB, tr *tracer.Tracer, l *Ledger, done func(*Ledger) bool) {
	t.Helper()
	SettleWith(t, tr, l, done, func() { l.Add(Collect(t, tr)) })
}

// SettleWith is Settle with another way to take one interval in (storing
// and committing it, for instance).
func SettleWith(t testing.TB, tr *tracer.Tracer, l *Ledger, done func(*Ledger) bool, next func()) {
	t.Helper()
	if poll.Settle(SettleLimit, func() bool { return done(l) }, next) {
		return
	}
	if l.LossBudget() > 0 {
		t.Logf("counts short of the traffic after %s, with %d calls lost for recursion", SettleLimit, l.Lost.RecursionMisses)
		return
	}
	st, err := tr.Stats()
	why := skipped(st)
	if err != nil {
		why = fmt.Sprintf("kernel-side statistics unreadable: %v", err)
	}
	t.Fatalf("counts never reached what the traffic did; have %s\nkernel-side losses since start: %+v; in this ledger's intervals: %+v\n%s",
		l, st.Lost, l.Lost, why)
}

// skipped says which programs the kernel skipped runs of for recursion
// and how many of those a later copy did: where a shortfall with no loss
// reported begins to be explained.
func skipped(st tracer.Stats) string {
	var names []string
	for name, p := range st.Programs {
		if p.RecursionMisses > 0 {
			names = append(names, fmt.Sprintf("%s %d", name, p.RecursionMisses))
		}
	}
	if len(names) == 0 {
		return "no program run was skipped for recursion"
	}
	slices.Sort(names)
	return fmt.Sprintf("runs skipped for recursion: %s; done by a later copy: %d", strings.Join(names, ", "), st.RecursionRecovered)
}

// Eventually polls cond every 50 ms until it returns nil, and fails the
// test with cond's last error after limit.
func Eventually(t testing.TB, limit time.Duration, what string, cond func() error) {
	t.Helper()
	if err := poll.Until(limit, 50*time.Millisecond, cond); err != nil {
		t.Fatalf("%s: not within %s: %v", what, limit, err)
	}
}

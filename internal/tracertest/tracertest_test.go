package tracertest

import (
	"errors"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/tracertest/poll"
	"github.com/deptrace/deptrace/tracer"
)

// The ledger sums one flow's counters over intervals, keeps the last
// process seen and the deepest accept queue, and sums losses.
func TestLedgerSumsIntervals(t *testing.T) {
	f := tracer.Flow{NetNS: 7, Proto: tracer.ProtoTCP, Direction: tracer.Inbound, LocalAddr: "192.0.2.1", RemoteAddr: "192.0.2.2", Port: 80}
	f1, f2 := f, f
	f1.Connections, f1.PID, f1.Comm = 2, 10, "a"
	f2.Connections, f2.BytesSent = 3, 5
	li := tracer.Listener{NetNS: 7, Proto: tracer.ProtoTCP, LocalAddr: "192.0.2.1", Port: 80, QueueMax: 4, Drops: 1}
	li2 := li
	li2.QueueMax, li2.Drops = 2, 2
	l := NewLedger()
	l.Add(tracer.Interval{Flows: []tracer.Flow{f1}, Listeners: []tracer.Listener{li}, Lost: tracer.Losses{UDPPeerUnknown: 1}})
	l.Add(tracer.Interval{Flows: []tracer.Flow{f2}, Listeners: []tracer.Listener{li2}, Lost: tracer.Losses{FlowMapFull: 1}})
	got := l.TCP(7, tracer.Inbound, 80)
	if got.Connections != 5 || got.BytesSent != 5 || got.PID != 10 || got.Comm != "a" {
		t.Errorf("flow %+v", got)
	}
	if n := l.CountTCP(7, 80); n != 1 {
		t.Errorf("%d tcp flows, want 1", n)
	}
	if ls := l.Listener(7, 80); ls.QueueMax != 4 || ls.Drops != 3 {
		t.Errorf("listener %+v", ls)
	}
	if l.Lost.Total() != 2 || l.StreamLosses() != 1 {
		t.Errorf("losses %+v, stream losses %d", l.Lost, l.StreamLosses())
	}
}

func TestPoll(t *testing.T) {
	n := 0
	if err := poll.Until(time.Second, time.Millisecond, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Errorf("Until: %v after %d calls", err, n)
	}
	if err := poll.Until(10*time.Millisecond, time.Millisecond, func() error { return errors.New("never") }); err == nil {
		t.Error("Until held a condition that never holds")
	}
	steps := 0
	if !poll.Settle(time.Second, func() bool { return steps >= 2 }, func() { steps++ }) || steps != 4 {
		t.Errorf("Settle: %d steps, want 2 then 2 more", steps)
	}
	if poll.Settle(10*time.Millisecond, func() bool { return false }, func() {}) {
		t.Error("Settle held a condition that never holds")
	}
}

func TestSkippedNamesTheSkippedPrograms(t *testing.T) {
	st := tracer.Stats{RecursionRecovered: 2, Programs: map[string]tracer.ProgramStats{
		"on_tcp_state_last": {RecursionMisses: 1},
		"on_recv":           {RecursionMisses: 5},
		"on_tcp_state":      {RecursionMisses: 3},
		"on_send_mid1":      {RecursionMisses: 2},
		"on_send":           {RunCount: 10},
	}}
	want := "runs skipped for recursion: on_recv 5, on_send_mid1 2, on_tcp_state 3, on_tcp_state_last 1; done by a later copy: 2"
	if got := skipped(st); got != want {
		t.Errorf("skipped = %q; want %q", got, want)
	}
	if got := skipped(tracer.Stats{}); got != "no program run was skipped for recursion" {
		t.Errorf("skipped without misses = %q", got)
	}
}

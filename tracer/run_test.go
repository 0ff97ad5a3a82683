package tracer

import (
	"context"
	"errors"
	"testing"
	"time"
	"unsafe"
)

// The handover of an interval in AsyncCommit mode: the first Commit or
// Abandon decides, a Commit's error is the drain's own if it came before
// emit returned (a later one is the handover's late error), and a failed Commit leaves the interval
// uncommitted (the kernel side keeps it).
func TestHandover(t *testing.T) {
	failing := errors.New("commit failed")
	cases := []struct {
		name          string
		commitErr     error
		act           func(iv Interval)
		beforeReturn  bool
		wantCommitted bool
		wantSyncErr   error
	}{
		{"committed in emit", nil, func(iv Interval) { _ = iv.Commit() }, true, true, nil},
		{"commit failed in emit", failing, func(iv Interval) { _ = iv.Commit() }, true, false, failing},
		{"commit failed later", failing, func(iv Interval) { _ = iv.Commit() }, false, false, nil},
		{"committed later", nil, func(iv Interval) { _ = iv.Commit() }, false, true, nil},
		{"abandoned", nil, func(iv Interval) { iv.Abandon() }, false, false, nil},
		{"abandoned then committed", nil, func(iv Interval) { iv.Abandon(); _ = iv.Commit() }, false, false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			iv := Interval{commit: func() error { return tc.commitErr }}
			h := newHandover(&iv)
			if h.settled() {
				t.Fatal("settled before Commit or Abandon")
			}
			var syncErr error
			if tc.beforeReturn {
				tc.act(iv)
				syncErr = h.emitted()
			} else {
				syncErr = h.emitted()
				tc.act(iv)
			}
			if !h.settled() {
				t.Fatal("not settled after Commit or Abandon")
			}
			if got := h.wait(); got != tc.wantCommitted {
				t.Errorf("committed %v, want %v", got, tc.wantCommitted)
			}
			if syncErr != tc.wantSyncErr {
				t.Errorf("error counted for the drain %v, want %v", syncErr, tc.wantSyncErr)
			}
			if wantLate := map[bool]error{true: tc.commitErr}[!tc.beforeReturn]; h.late() != wantLate {
				t.Errorf("late error %v, want %v", h.late(), wantLate)
			}
		})
	}
	// Without a pinned kernel side there is nothing to commit: Commit
	// still settles the handover.
	iv := Interval{}
	h := newHandover(&iv)
	if err := iv.Commit(); err != nil || !h.wait() {
		t.Errorf("unpinned commit: %v, committed %v", err, h.wait())
	}
}

// In AsyncCommit mode a commit that fails after emit returned counts as a
// failed drain too: maxDrainErrors of them in a row end the loop, while
// one success between failures starts the count again.
func TestLateCommitErrorsEndTheLoop(t *testing.T) {
	failing := errors.New("commit failed")
	run := func(fails func(n int) bool) (drains int, err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		collect := func() (Interval, error) {
			drains++
			n := drains
			return Interval{commit: func() error {
				if fails(n) {
					return failing
				}
				return nil
			}}, nil
		}
		emit := func(iv Interval) error {
			go func() { _ = iv.Commit() }() // stored later, as the agent's writer does
			return nil
		}
		err = runLoop(ctx, 5*time.Millisecond, collect, RunOptions{AsyncCommit: true}, emit)
		return drains, err
	}
	drains, err := run(func(int) bool { return true })
	if !errors.Is(err, failing) || drains != maxDrainErrors {
		// The third failure is seen when the fourth drain is due, which
		// then does not happen.
		t.Errorf("every commit failing: %d drains, %v; want the loop ended after %d failed commits", drains, err, maxDrainErrors)
	}
	drains, err = run(func(n int) bool { return n%2 == 0 })
	if err != nil || drains < 2*maxDrainErrors {
		t.Errorf("every other commit failing: %d drains, %v; want the loop to run until its context ends", drains, err)
	}
}

// ReuseFlows builds the next interval in the flows emit was given, which
// an asynchronous consumer still holds: RunWith refuses the pair before
// it drains anything.
func TestReuseFlowsNeedsASynchronousEmit(t *testing.T) {
	tr := &Tracer{}
	emitted := false
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("RunWith(ReuseFlows, AsyncCommit) went on to drain (%v) instead of refusing", r)
		}
	}()
	err := tr.RunWith(context.Background(), RunOptions{ReuseFlows: true, AsyncCommit: true}, func(Interval) error {
		emitted = true
		return nil
	})
	if err == nil || emitted {
		t.Fatalf("RunWith(ReuseFlows, AsyncCommit): error %v, emitted %v; want an error and nothing emitted", err, emitted)
	}
}

// The next interval's flows go into the spare when it has room, and not
// into a burst's, kept beyond need.
func TestFlowsForReusesOnlyAFittingSpare(t *testing.T) {
	spare := make([]Flow, 3, 3000)
	for _, c := range []struct {
		n     int
		reuse bool
	}{{0, false}, {1000, true}, {3000, true}, {3001, false}, {900, false}} {
		got := flowsFor(spare, c.n)
		if len(got) != 0 || cap(got) < c.n {
			t.Errorf("%d flows: len %d cap %d, want empty with room for them", c.n, len(got), cap(got))
		}
		if reused := cap(got) > 0 && unsafe.SliceData(got[:1]) == &spare[0]; reused != c.reuse {
			t.Errorf("%d flows into a spare of %d: reused %v, want %v", c.n, cap(spare), reused, c.reuse)
		}
	}
}

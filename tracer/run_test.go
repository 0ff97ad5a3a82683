package tracer

import (
	"errors"
	"testing"
)

// The handover of an interval in AsyncCommit mode: the first Commit or
// Abandon decides, a Commit's error counts as a failed drain only if it
// came before emit returned, and a failed Commit leaves the interval
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

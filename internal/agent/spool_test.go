package agent

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

func batch(n int) store.Batch {
	return store.Batch{Observations: []store.Observation{{HostID: "h", Direction: "outbound", Proto: "tcp",
		LocalAddr: "198.51.100.1", RemoteAddr: "198.51.100.2", Port: uint16(n), Counters: tracer.Counters{Connections: uint64(n)}, LastSeen: time.Unix(int64(n), 0)}}}
}

func TestSpoolKeepsOrderAndRetriesWhatFailed(t *testing.T) {
	s := &spool{path: filepath.Join(t.TempDir(), "spool.jsonl"), max: 1 << 20}
	for i := 1; i <= 5; i++ {
		if err := s.add(batch(i)); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint16
	fail := errors.New("store down")
	n, err := s.replay(func(b store.Batch) error {
		if b.Observations[0].Port == 3 {
			return fail
		}
		got = append(got, b.Observations[0].Port)
		return nil
	})
	if !errors.Is(err, fail) || n != 2 {
		t.Fatalf("replay: %d %v", n, err)
	}
	if _, batches, _ := SpoolStatus(s.path); batches != 3 {
		t.Errorf("%d batches left, want 3 (the failed one and after)", batches)
	}
	n, err = s.replay(func(b store.Batch) error { got = append(got, b.Observations[0].Port); return nil })
	if err != nil || n != 3 {
		t.Fatalf("second replay: %d %v", n, err)
	}
	if want := []uint16{1, 2, 3, 4, 5}; len(got) != 5 || got[2] != 3 || got[4] != 5 {
		t.Errorf("order %v, want %v", got, want)
	}
	if s.pending() {
		t.Error("spool not empty after a full replay")
	}
}

func TestSpoolIsBounded(t *testing.T) {
	s := &spool{path: filepath.Join(t.TempDir(), "spool.jsonl"), max: 600}
	var errs int
	for i := 1; i <= 20; i++ {
		if err := s.add(batch(i)); err != nil {
			if !errors.Is(err, errSpoolFull) {
				t.Fatal(err)
			}
			errs++
		}
	}
	if s.size() > 600 || errs == 0 || s.dropped != uint64(errs) {
		t.Errorf("size %d, %d refused, %d counted dropped", s.size(), errs, s.dropped)
	}
}

package store

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// shapesObservation is one flow's observation that counts a connection
// and fills, of the next counters, those of m's bits: m names a set of
// columns.
func shapesObservation(at time.Time, port uint16, m int) Observation {
	o := Observation{Bucket: at, HostID: "h", Direction: "outbound", Proto: "tcp", LocalAddr: "10.0.0.1", RemoteAddr: "10.0.0.2",
		Port: port, Comm: "c", FirstSeen: at, LastSeen: at}
	for i, v := range counterFields(&o.Counters)[1:] {
		if m&(1<<i) != 0 {
			*v = uint64(i + 2)
		}
	}
	o.Counters.Connections = 1
	return o
}

func openShapes(t *testing.T) *Store {
	t.Helper()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "shapes.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkOneFlowStored reads the store back: one flow, with want's counters.
func checkOneFlowStored(t *testing.T, s *Store, want tracer.Counters) {
	t.Helper()
	got, err := s.Observations(context.Background(), Range{})
	if err != nil || len(got) != 1 {
		t.Fatalf("%v %+v", err, got)
	}
	if got[0].Counters != want {
		t.Errorf("stored\n %+v\nwant\n %+v", got[0].Counters, want)
	}
}

// Statements of some counter columns are data-driven, so their number is
// bounded: past maxColumnSets a write uses the statement of every column,
// and every count still lands.
func TestColumnSetsAreBounded(t *testing.T) {
	ctx := context.Background()
	s := openShapes(t)
	at := time.Now().Truncate(time.Minute)
	const masks = 3 * maxColumnSets
	var want tracer.Counters
	for round := 0; round < 3; round++ { // admitted in the second, used in the third
		for m := 1; m <= masks; m++ {
			o := shapesObservation(at, 80, m)
			want.Add(o.Counters)
			if err := s.Write(ctx, Batch{Observations: []Observation{o}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.stmtMu.Lock()
	sets, masked := len(s.columnSets), 0
	for sh := range s.stmts {
		if sh.table != "flow_keys" && sh.cols != everyCounter {
			masked++
			if !s.columnSets[columnSet{sh.table, sh.cols}] {
				t.Errorf("%+v prepared outside the admitted sets", sh)
			}
		}
	}
	s.stmtMu.Unlock()
	if sets != maxColumnSets || masked < maxColumnSets {
		t.Errorf("%d column sets admitted, %d statements of them, want %d and at least as many", sets, masked, maxColumnSets)
	}
	checkOneFlowStored(t, s, want)
}

// Once writes wanted a set of columns twice, the writes after use its own
// statements (a write that falls back to the statement of every column
// notes its shape), and a set wanted once takes no place.
func TestColumnSetStatementsAreUsed(t *testing.T) {
	ctx := context.Background()
	s := openShapes(t)
	at := time.Now().Truncate(time.Minute)
	const usual, once = 0b101, 0b11
	if err := s.Write(ctx, Batch{Observations: []Observation{shapesObservation(at, 81, once)}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if err := s.Write(ctx, Batch{Observations: []Observation{shapesObservation(at, 80, usual)}}); err != nil {
			t.Fatal(err)
		}
		s.stmtMu.Lock()
		fellBack := len(s.stmtsWanted)
		s.stmtMu.Unlock()
		if wantFallBack := i < 2; (fellBack > 0) != wantFallBack {
			t.Errorf("write %d: %d shapes noted for lack of a statement; want some: %v", i+1, fellBack, wantFallBack)
		}
	}
	setOf := func(m int) columnSet {
		o := shapesObservation(at, 80, m)
		return columnSet{levels[0].table, filledColumns(&o.Counters)}
	}
	usualSet, onceSet := setOf(usual), setOf(once)
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if !s.columnSets[usualSet] || s.stmts[writeShape{usualSet.table, 1, usualSet.cols}] == nil {
		t.Errorf("the set written four times has no statement: sets %v", s.columnSets)
	}
	if s.columnSets[onceSet] {
		t.Errorf("the set written once was admitted: sets %v", s.columnSets)
	}
}

// Two writers sharing one SQLite store: one prepares a set's statements
// while the other, inside its transaction (holding SQLite's one
// connection), looks its statements up. Neither may wait for the other.
func TestSharedStoreWritersPrepareWithoutDeadlock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openShapes(t)
	at := time.Now().Truncate(time.Minute)
	const writes = 30
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < writes; i++ {
				// A new set every third write, each wanted three times.
				o := shapesObservation(at, uint16(80+w), 1+w+2*(i/3))
				if err := s.Write(ctx, Batch{Observations: []Observation{o}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a writer failed (the deadline of a deadlock?): %v", err)
	}
	s.stmtMu.Lock()
	sets := len(s.columnSets)
	s.stmtMu.Unlock()
	if sets == 0 {
		t.Error("no set admitted: the writers never prepared while the other wrote")
	}
}

// Sets that stop recurring are forgotten, but not the one that recurs:
// writes of many one-off sets beside the usual one do not reset its count.
// (The rows are of the open minute: they go to the minute table only.)
func TestOneOffColumnSetsAreForgotten(t *testing.T) {
	ctx := context.Background()
	s := openShapes(t)
	at := time.Now().Truncate(time.Minute)
	const oneOff, usual = 5 * maxColumnSets, 127
	burst := func(first int) []Observation {
		b := []Observation{shapesObservation(at, 80, usual)}
		for m := first; m < first+oneOff; m++ {
			b = append(b, shapesObservation(at, uint16(1000+m), m))
		}
		return b
	}
	// The usual set is wanted by the first two writes, each with 40
	// one-off sets: the third write finds its statements.
	for _, b := range [][]Observation{burst(1), burst(1 + oneOff), {shapesObservation(at, 80, usual)}} {
		if err := s.Write(ctx, Batch{Observations: b}); err != nil {
			t.Fatal(err)
		}
	}
	o := shapesObservation(at, 80, usual)
	set := columnSet{levels[0].table, filledColumns(&o.Counters)}
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if !s.columnSets[set] || len(s.stmtsWanted) > 0 {
		t.Errorf("the set wanted by every write was not admitted in time: admitted %v, shapes wanted %d", s.columnSets[set], len(s.stmtsWanted))
	}
	minuteSets := 0
	for set := range s.columnSets {
		if set.table == levels[0].table {
			minuteSets++
		}
	}
	if minuteSets != 1 || len(s.setsWanted) > oneOff || len(s.setsPreparing) > 0 {
		t.Errorf("%d sets of the minute table admitted, %d counted, %d preparing; want 1, at most %d (the first burst forgotten) and 0", minuteSets, len(s.setsWanted), len(s.setsPreparing), oneOff)
	}
}

// A statement of some columns that fails to prepare is left out: the
// writes go on with the statement of every column, every count lands, and
// the set gives its place back, to be admitted again once prepares work.
func TestFailedColumnSetPrepareFallsBack(t *testing.T) {
	ctx := context.Background()
	s := openShapes(t)
	testHooks.failPrepare = func(sh writeShape) bool { return sh.table != "flow_keys" && sh.cols != everyCounter }
	defer func() { testHooks.failPrepare = nil }()
	at := time.Now().Truncate(time.Minute)
	var want tracer.Counters
	write := func() {
		t.Helper()
		o := shapesObservation(at, 80, 5)
		want.Add(o.Counters)
		if err := s.Write(ctx, Batch{Observations: []Observation{o}}); err != nil {
			t.Fatal(err)
		}
	}
	state := func() (sets, masked, fellBack int) {
		s.stmtMu.Lock()
		defer s.stmtMu.Unlock()
		for sh := range s.stmts {
			if sh.table != "flow_keys" && sh.cols != everyCounter {
				masked++
			}
		}
		return len(s.columnSets), masked, len(s.stmtsWanted)
	}
	// Wanted by the first two writes, admitted before the third, whose
	// prepare fails; the fourth wants it once more.
	for range 4 {
		write()
	}
	if sets, masked, fellBack := state(); sets != 0 || masked != 0 || fellBack == 0 {
		t.Errorf("with prepares failing: %d sets admitted, %d statements of some columns, %d shapes fell back; want 0, 0 and some", sets, masked, fellBack)
	}
	testHooks.failPrepare = nil
	write() // the set's second want: admitted, prepared and used
	if sets, masked, fellBack := state(); sets != 1 || masked == 0 || fellBack != 0 {
		t.Errorf("prepares working again: %d sets admitted, %d statements of some columns, %d shapes fell back; want 1, some and 0", sets, masked, fellBack)
	}
	checkOneFlowStored(t, s, want)
}

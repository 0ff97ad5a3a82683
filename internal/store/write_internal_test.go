package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// Statements of some counter columns are data-driven, so their number is
// bounded: past maxRowShapes a write uses the statement of every column,
// and every count still lands.
func TestRowShapesAreBounded(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "shapes.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Now().Truncate(time.Minute)
	const masks = 3 * maxRowShapes
	var want uint64
	for round := 0; round < 2; round++ { // the second round finds the first's shapes prepared
		for m := 1; m <= masks; m++ {
			o := Observation{Bucket: at, HostID: "h", Direction: "outbound", Proto: "tcp", LocalAddr: "10.0.0.1", RemoteAddr: "10.0.0.2",
				Port: 80, Comm: "c", FirstSeen: at, LastSeen: at}
			// Every row counts one connection, and m names which of the
			// other counters it fills: masks distinct sets of columns.
			for i, v := range counterFields(&o.Counters)[1:] {
				if m&(1<<i) != 0 {
					*v = 1
				}
			}
			o.Counters.Connections = 1
			want++
			if err := s.Write(ctx, Batch{Observations: []Observation{o}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.stmtMu.Lock()
	shapes, prepared := s.rowShapes, len(s.stmts)
	s.stmtMu.Unlock()
	if base := 9 * (1 + len(levels)); shapes != maxRowShapes || prepared != base+maxRowShapes {
		t.Errorf("%d row shapes and %d statements prepared, want %d and %d", shapes, prepared, maxRowShapes, base+maxRowShapes)
	}
	got, err := s.Observations(ctx, Range{})
	if err != nil || len(got) != 1 {
		t.Fatalf("%v %+v", err, got)
	}
	if got[0].Connections != want {
		t.Errorf("%d connections stored, want %d", got[0].Connections, want)
	}
}

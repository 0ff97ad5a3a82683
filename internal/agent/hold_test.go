package agent

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/store"
)

// A batch larger than the whole buffer is dropped alone: the batches
// already kept stay, and they are pushed out oldest first only by batches
// that fit.
func TestHoldDropsAnOversizedBatchAlone(t *testing.T) {
	small := store.Batch{ID: "a"}
	n := batchBytes(small)
	w := &writer{cfg: Config{BufferMax: 3 * n}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), spool: &spool{path: "unused"}}
	for _, id := range []string{"a", "b", "c"} {
		if !w.hold(store.Batch{ID: id}) {
			t.Fatalf("batch %s of %d bytes not kept in a buffer of %d", id, n, w.cfg.BufferMax)
		}
	}
	big := store.Batch{ID: strings.Repeat("x", int(4*n))}
	if w.hold(big) {
		t.Fatal("a batch larger than the buffer was kept")
	}
	if len(w.held) != 3 || w.held[0].batch.ID != "a" || w.dropped != 1 {
		t.Fatalf("after an oversized batch: %d kept (first %q), %d dropped; want a, b, c kept and 1 dropped", len(w.held), w.held[0].batch.ID, w.dropped)
	}
	if !w.hold(store.Batch{ID: "d"}) || len(w.held) != 3 || w.held[0].batch.ID != "b" || w.dropped != 2 {
		t.Fatalf("a batch that fits pushed out %d (kept %d, first %q); want the oldest alone", w.dropped-1, len(w.held), w.held[0].batch.ID)
	}
}

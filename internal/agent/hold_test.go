package agent

import (
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
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

// Every string of an identity counts in a held batch's size, on flows and
// on DNS records alike: a new Identity field left out of identityBytes
// fails here.
func TestBatchBytesCountsIdentities(t *testing.T) {
	var id tracer.Identity
	v := reflect.ValueOf(&id).Elem()
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).Kind() != reflect.String {
			t.Fatalf("tracer.Identity.%s is a %s: count it in identityBytes", v.Type().Field(i).Name, v.Field(i).Kind())
		}
		v.Field(i).SetString(strings.Repeat("x", 100))
	}
	want := int64(100 * v.NumField())
	plain := batchBytes(store.Batch{Observations: []store.Observation{{}}, DNS: []store.DNSObservation{{}}})
	named := batchBytes(store.Batch{Observations: []store.Observation{{Identity: id}}, DNS: []store.DNSObservation{{Identity: id}}})
	if named-plain != 2*want {
		t.Errorf("a flow and a DNS record with %d bytes of identity each grow the batch by %d bytes, want %d", want, named-plain, 2*want)
	}
}

// With --buffer-max 0 and no pinned kernel side nothing is kept while the
// store and spool fail: the recovery line says how many batches were
// dropped, not that a kernel kept them.
func TestRecoveryLineWithoutABuffer(t *testing.T) {
	var logs strings.Builder
	w := &writer{cfg: Config{BufferMax: 0}, log: slog.New(slog.NewTextHandler(&logs, nil)), spool: &spool{path: "unused"}}
	for _, id := range []string{"a", "b"} {
		if w.hold(store.Batch{ID: id}) {
			t.Fatalf("batch %s kept in a buffer of 0 bytes", id)
		}
	}
	w.resumed("store")
	out := logs.String()
	if !strings.Contains(out, "no batch could be kept in memory meanwhile") || !strings.Contains(out, "batches_dropped=2") || strings.Contains(out, "kernel kept") {
		t.Errorf("recovery after 2 dropped batches:\n%s", out)
	}
	if w.holding || w.heldDropped != 0 {
		t.Errorf("after the recovery line: holding %v, %d dropped still counted", w.holding, w.heldDropped)
	}
}

package agent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/metrics"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// Past --store-max-size the agent deletes the oldest days, logs one line
// and counts it; under it, it does nothing and says nothing.
func TestStoreCeilingActsOnceWithOneLine(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "deptrace.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	for d := 10; d >= 0; d-- {
		at := today.AddDate(0, 0, -d)
		var b store.Batch
		for i := range 2000 {
			b.Observations = append(b.Observations, store.Observation{Bucket: at, HostID: "h", Direction: "outbound", Proto: "tcp",
				LocalAddr: "198.51.100.1", RemoteAddr: fmt.Sprintf("10.0.%d.%d", i/250, i%250), Port: uint16(d + 1), Comm: "client",
				Counters: tracer.Counters{Connections: 1}, FirstSeen: at, LastSeen: at})
		}
		if err := st.Write(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	size, err := st.Size(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	m := metrics.New(metrics.Options{})
	w := &writer{cfg: Config{StoreMaxSize: size / 2}, log: slog.New(slog.NewTextHandler(&logs, nil)), store: st, metrics: m}
	w.retain()
	w.lastRetain = time.Time{} // a minute later: under the ceiling now
	w.retain()
	if n := strings.Count(logs.String(), "store over --store-max-size: deleted the oldest buckets"); n != 1 {
		t.Errorf("%d lines about the ceiling, want 1:\n%s", n, logs.String())
	}
	if got := gauge(t, m, "deptrace_store_ceiling_deletions_total"); got != 1 {
		t.Errorf("deptrace_store_ceiling_deletions_total %v, want 1", got)
	}
	if got := gauge(t, m, "deptrace_store_size_bytes"); got <= 0 || got > float64(size/2) {
		t.Errorf("deptrace_store_size_bytes %v, want at most the ceiling %d", got, size/2)
	}
	obs, err := st.Observations(ctx, store.Range{})
	if err != nil {
		t.Fatal(err)
	}
	per := map[uint16]int{}
	for _, o := range obs {
		per[o.Port]++
	}
	if per[1] != 2000 || per[11] != 0 {
		t.Errorf("flows kept per day (port d+1 for d days ago): %v; want today's whole and the oldest day gone", per)
	}
}

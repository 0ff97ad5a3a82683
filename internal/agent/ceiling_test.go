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
	today := time.Now().UTC().Truncate(24 * time.Hour)
	st := sqliteStore(t, 11, func(i int) store.Batch {
		d := 10 - i // the oldest day first
		return store.Batch{Observations: clientFlows(today.AddDate(0, 0, -d), uint16(d+1), 2000)}
	})
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

// Over --store-max-size with all its history in the current hour, which
// the ceiling never deletes, the agent deletes nothing, counts no
// deletion, and says so in a line of its own (what remains, why, what to
// do), once while it lasts; the gauge shows it. Once the hour has ended
// the hour goes, as a deletion.
func TestStoreCeilingBlockedByTheCurrentHour(t *testing.T) {
	ctx := context.Background()
	hour := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	st := sqliteStore(t, 40, func(m int) store.Batch {
		at := hour.Add(time.Duration(m)*time.Minute + 20*time.Second)
		return store.Batch{ID: fmt.Sprint("b", m), Observations: clientFlows(at, 80, 50)}
	})
	size, err := st.Size(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := hour.Add(40 * time.Minute)
	var logs bytes.Buffer
	m := metrics.New(metrics.Options{})
	w := &writer{cfg: Config{StoreMaxSize: size / 2}, log: slog.New(slog.NewTextHandler(&logs, nil)), store: st, metrics: m, clock: func() time.Time { return now },
		spool: &spool{path: filepath.Join(t.TempDir(), "spool.jsonl"), max: 1 << 20}}
	for range 20 { // 20 minutes, a check each
		w.retain()
		now = now.Add(time.Minute)
	}
	want := fmt.Sprintf(`level=WARN msg="store over --store-max-size, but nothing deleted: all its buckets left are of the current hour, which the ceiling never deletes" size_bytes=%d max_bytes=%d current_hour_rows=2100 batch_ids=40 deletable_from=2026-11-20T13:00:00Z hint="raise --store-max-size, or wait for the hour to end: the ceiling then deletes it"`, size, size/2)
	if lines := strings.Split(strings.TrimSpace(logs.String()), "\n"); len(lines) != 1 || !strings.HasSuffix(lines[0], want) {
		t.Errorf("20 checks within the hour logged:\n%s\nwant one line ending\n%s", logs.String(), want)
	}
	for name, want := range map[string]float64{"deptrace_store_ceiling_deletions_total": 0, "deptrace_store_ceiling_blocked": 1, "deptrace_store_size_bytes": float64(size)} {
		if got := gauge(t, m, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// The hour over (13:00), it goes: a deletion, with no batch to store
	// (an idle agent's check between intervals).
	logs.Reset()
	w.idle()
	if n := strings.Count(logs.String(), "store over --store-max-size: deleted the oldest buckets"); n != 1 || strings.Contains(logs.String(), "nothing deleted") {
		t.Errorf("after the hour:\n%s\nwant one line about the deletion", logs.String())
	}
	// Still over the ceiling once the hour went (the day rows stay), the
	// gauge says so, and the log that nothing more could go.
	blocked := 0.0
	if gauge(t, m, "deptrace_store_size_bytes") > float64(size/2) {
		blocked = 1
	}
	if still := strings.Contains(logs.String(), "store still over --store-max-size after deleting the oldest buckets: all its buckets left are of the current hour"); still != (blocked == 1) {
		t.Errorf("after the hour, blocked %v:\n%s", blocked, logs.String())
	}
	for name, want := range map[string]float64{"deptrace_store_ceiling_deletions_total": 1, "deptrace_store_ceiling_blocked": blocked} {
		if got := gauge(t, m, name); got != want {
			t.Errorf("after the hour: %s = %v, want %v", name, got, want)
		}
	}
}

// A store over the ceiling without any bucket (only what the ceiling
// never deletes) is said to be so once an hour while it lasts.
func TestStoreCeilingBlockedWithoutBucketsRepeatsHourly(t *testing.T) {
	st := sqliteStore(t, 0, nil)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	w := &writer{cfg: Config{StoreMaxSize: 1}, log: slog.New(slog.NewTextHandler(&logs, nil)), store: st, clock: func() time.Time { return now }}
	for range 3 * 60 {
		w.retain()
		now = now.Add(time.Minute)
	}
	const msg = `msg="store over --store-max-size, but nothing deleted: it holds no buckets, only what the ceiling never deletes (batch ids, kept 30d, and the flow keys and names of the current day)"`
	if n := strings.Count(logs.String(), msg); n != 3 || strings.Count(logs.String(), "\n") != 3 || !strings.Contains(logs.String(), `current_hour_rows=0 batch_ids=0 hint="raise --store-max-size"`) {
		t.Errorf("3 hours blocked logged:\n%s\nwant 3 lines %s", logs.String(), msg)
	}
}

// sqliteStore opens a fresh SQLite store, closed when the test ends,
// without background compaction, and writes n batches into it, batch(0)
// first.
func sqliteStore(t *testing.T, n int, batch func(i int) store.Batch) *store.Store {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "deptrace.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// No background compaction: started by the first write, it could
	// still be adding pages when a test reads the size, and the sizes the
	// ceiling logs would differ from the test's by a few pages (2-5 % of
	// runs failed so).
	st.SetAutoCompact(false)
	for i := range n {
		if err := st.Write(ctx, batch(i)); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// clientFlows is n outbound tcp flows of client on host h, each one
// connection seen at at, to n addresses of 10.0.0.0/16 on port.
func clientFlows(at time.Time, port uint16, n int) []store.Observation {
	obs := make([]store.Observation, n)
	for i := range obs {
		obs[i] = store.Observation{Bucket: at.Truncate(time.Minute), HostID: "h", Direction: "outbound", Proto: "tcp",
			LocalAddr: "198.51.100.1", RemoteAddr: fmt.Sprintf("10.0.%d.%d", i/250, i%250), Port: port, Comm: "client",
			Counters: tracer.Counters{Connections: 1}, FirstSeen: at, LastSeen: at}
	}
	return obs
}

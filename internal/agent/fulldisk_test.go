package agent

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/metrics"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// smallFS mounts a tmpfs of size bytes on a fresh directory for the
// test's lifetime.
func smallFS(t *testing.T, size int) string {
	t.Helper()
	testnet.RequireRoot(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Fatalf("mount a tmpfs of %d bytes on %s: %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes a file until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the file system: %v", err)
			}
			break
		}
	}
	for _, n := range []int{4096, 512, 1} { // the last bytes a page holds
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
}

// wideBatch is batch number n: flows flows, each its own key (so that
// storing it needs new pages), one connection each, on port n.
func wideBatch(n, flows int) store.Batch {
	at := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC).Add(time.Duration(n) * 5 * time.Second)
	b := store.Batch{ID: fmt.Sprintf("fulldisk-%d", n)}
	for i := range flows {
		b.Observations = append(b.Observations, store.Observation{Bucket: at.Truncate(time.Minute), HostID: "h", Direction: "outbound", Proto: "tcp",
			LocalAddr: "198.51.100.1", RemoteAddr: fmt.Sprintf("10.%d.%d.%d", n, i/250, i%250), Port: uint16(n), Comm: "client",
			Counters: tracer.Counters{Connections: 1, BytesSent: 1000}, FirstSeen: at, LastSeen: at})
	}
	return b
}

// The store and the spool share a small file system that fills up: the
// agent keeps the newest batches in memory up to --buffer-max, counts
// the ones it drops, logs one line when writing starts failing and one
// when it recovers (with the number dropped), writes what it kept once
// space is freed, and the SQLite store stays intact.
func TestFullDiskKeepsTheNewestBatchesInMemory(t *testing.T) {
	dir := smallFS(t, 4<<20)
	ctx := context.Background()
	dbPath := filepath.Join(dir, "deptrace.db")
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { st.Close() }()
	const flows, bound = 100, 8 // batches the memory holds
	var logs bytes.Buffer
	m := metrics.New(metrics.Options{})
	w := &writer{
		cfg:     Config{Store: dbPath, SpoolPath: filepath.Join(dir, "spool.jsonl"), SpoolMax: 256 << 20, BufferMax: bound*batchBytes(wideBatch(10, flows)) + batchBytes(wideBatch(10, flows))/2},
		log:     slog.New(slog.NewTextHandler(&logs, nil)),
		store:   st,
		spool:   &spool{path: filepath.Join(dir, "spool.jsonl"), max: 256 << 20},
		metrics: m,
	}
	write := func(n int) {
		t.Helper()
		if !w.write(wideBatch(n, flows)) && n > 5 {
			t.Logf("batch %d dropped on arrival", n)
		}
		w.metrics.SetBuffer(len(w.held), w.heldBytes, w.dropped)
	}
	for n := 1; n <= 5; n++ {
		write(n)
	}
	if w.holding || w.failing {
		t.Fatalf("writes failed before the disk was full:\n%s", logs.String())
	}
	fill(t, filepath.Join(dir, "filler"))
	const during = 40 // batches 6..45 arrive while the disk is full
	peak := 0
	for n := 6; n < 6+during; n++ {
		write(n)
		peak = max(peak, len(w.held))
	}
	if !w.holding || peak != bound || len(w.held) != bound {
		t.Fatalf("disk full: holding %v, %d batches in memory (peak %d), want the bound %d\n%s", w.holding, len(w.held), peak, bound, logs.String())
	}
	if got := gauge(t, m, "deptrace_buffered_batches"); got != bound {
		t.Errorf("deptrace_buffered_batches %v, want %d", got, bound)
	}
	dropped := int(w.dropped)
	if got := gauge(t, m, "deptrace_dropped_batches_total"); int(got) != dropped || dropped == 0 {
		t.Errorf("deptrace_dropped_batches_total %v, %d dropped", got, dropped)
	}
	w.flush() // the 5 s retry, still full: nothing changes
	if len(w.held) != bound {
		t.Fatalf("flushing on a full disk lost batches: %d held", len(w.held))
	}
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
	w.flush() // the 5 s retry, space freed
	if w.holding || len(w.held) != 0 || w.failing {
		t.Fatalf("space freed: holding %v, %d in memory, store failing %v\n%s", w.holding, len(w.held), w.failing, logs.String())
	}
	write(46)
	write(47)

	text := logs.String()
	if n := strings.Count(text, "cannot be written"); n != 1 {
		t.Errorf("%d lines saying writing fails, want 1:\n%s", n, text)
	}
	if n := strings.Count(text, "writing recovered"); n != 1 || !strings.Contains(text, fmt.Sprintf("batches_dropped=%d", dropped)) {
		t.Errorf("%d recovery lines, want 1 with batches_dropped=%d:\n%s", n, dropped, text)
	}
	if strings.Contains(text, "spooling and retrying") {
		t.Errorf("a separate line for the store's failure:\n%s", text)
	}

	// What the store holds: every batch written before the disk filled,
	// those the store or spool took while it filled (a prefix), then,
	// after the dropped ones (the oldest of those kept in memory), the
	// newest, each counted once.
	got, err := st.Observations(ctx, store.Range{})
	if err != nil {
		t.Fatal(err)
	}
	per := map[int]int{}
	for _, o := range got {
		per[int(o.Port)] += int(o.Connections)
	}
	taken := 0 // batches of the 40 the store or spool took before memory
	for per[6+taken] > 0 {
		taken++
	}
	for n := 1; n <= 47; n++ {
		want := flows
		if n >= 6+taken && n < 6+taken+dropped {
			want = 0
		}
		if per[n] != want {
			t.Errorf("batch %d: %d connections stored, want %d (%d taken while filling, %d dropped)", n, per[n], want, taken, dropped)
		}
	}
	if taken+dropped+bound != during {
		t.Errorf("%d taken + %d dropped + %d kept != %d batches", taken, dropped, bound, during)
	}
	t.Logf("disk full for %d batches: %d taken while space lasted, %d dropped, %d kept in memory and written", during, taken, dropped, bound)
	if _, batches, err := SpoolStatus(w.spool.path); err != nil || batches != 0 {
		t.Errorf("spool holds %d batches (%v) after recovery", batches, err)
	}
	st.Close()
	db, err := sql.Open("sqlite", dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var check string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Errorf("integrity_check: %q, %v", check, err)
	}
}

// gauge reads the value of an unlabelled metric.
func gauge(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.Metric) != 1 {
			continue
		}
		if g := mf.Metric[0].Gauge; g != nil {
			return g.GetValue()
		}
		if c := mf.Metric[0].Counter; c != nil {
			return c.GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/pgtest"
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
	s := &spool{path: filepath.Join(t.TempDir(), "spool.jsonl"), max: 2000} // two batches
	var errs int
	for i := 1; i <= 20; i++ {
		if err := s.add(batch(i)); err != nil {
			if !errors.Is(err, errSpoolFull) {
				t.Fatal(err)
			}
			errs++
		}
	}
	if s.size() > 2000 || errs != 18 || s.dropped != uint64(errs) {
		t.Errorf("size %d, %d refused, %d counted dropped", s.size(), errs, s.dropped)
	}
}

// What a batch holds for a unix flow: path sockets belong to the machine
// (the root namespace's host) from any namespace, abstract ones to their
// namespace; the peer process and every counter are kept.
func TestUnixFlowObservation(t *testing.T) {
	at := time.Date(2026, 11, 20, 10, 0, 30, 0, time.UTC)
	f := tracer.Flow{Kind: tracer.KindFlow, Time: at, NetNS: 99, Proto: tracer.ProtoUnix, Direction: tracer.Outbound,
		RemoteAddr: "/run/app.sock", PID: 10, Comm: "nginx", PeerPID: 20, PeerComm: "gunicorn",
		Counters: tracer.Counters{Connections: 3, BytesSent: 30, ResetsReceived: 1}, FirstSeen: at, LastSeen: at}
	if ns := flowNetNS(f, 1); ns != 1 {
		t.Errorf("path socket in netns 99 went to %d, want the root's 1", ns)
	}
	abstract := f
	abstract.RemoteAddr = "@app"
	if ns := flowNetNS(abstract, 1); ns != 99 {
		t.Errorf("abstract socket went to %d, want its namespace 99", ns)
	}
	in := f
	in.Direction, in.LocalAddr, in.RemoteAddr = tracer.Inbound, "/run/app.sock", ""
	if ns := flowNetNS(in, 1); ns != 1 {
		t.Errorf("inbound path socket went to %d", ns)
	}
	tcp := f
	tcp.Proto, tcp.RemoteAddr = tracer.ProtoTCP, "198.51.100.2"
	if ns := flowNetNS(tcp, 1); ns != 99 {
		t.Errorf("tcp flow moved to %d", ns)
	}
	o := Observation("web", f, store.DefaultBucket)
	if o.HostID != "web" || o.Proto != "unix" || o.RemoteAddr != "/run/app.sock" || o.Port != 0 || o.PeerPID != 20 || o.PeerComm != "gunicorn" ||
		o.Counters != f.Counters || !o.Bucket.Equal(at.Truncate(time.Minute)) {
		t.Errorf("observation %+v", o)
	}
}

// The agent crashes after the store committed a batch and before the
// spool forgot it: the next agent replays the spool, and the store counts
// the batch once. On both back ends.
func TestReplayAfterCrashCountsOnce(t *testing.T) {
	ctx := context.Background()
	for name, spec := range map[string]string{"sqlite": filepath.Join(t.TempDir(), "deptrace.db"), "postgres": pgtest.Start(t)} {
		t.Run(name, func(t *testing.T) {
			st, err := store.Open(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			sp := &spool{path: filepath.Join(t.TempDir(), "spool.jsonl"), max: 1 << 20}
			first, second := batch(3), batch(3)
			first.ID, second.ID = "0123456789abcdef0123456789abcdef-1", "0123456789abcdef0123456789abcdef-2"
			// Both batches were spooled while the store was down; the
			// store came back and the first was written, then the agent
			// died before the spool was truncated.
			for _, b := range []store.Batch{first, second} {
				if err := sp.add(b); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.Write(ctx, first); err != nil {
				t.Fatal(err)
			}
			// The next agent replays everything the spool holds.
			n, err := sp.replay(func(b store.Batch) error { return st.Write(ctx, b) })
			if err != nil || n != 2 {
				t.Fatalf("replay: %d %v", n, err)
			}
			obs, err := st.Observations(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			if len(obs) != 1 || obs[0].Connections != 6 {
				t.Errorf("after the replay: %+v; want 6 connections (two batches of 3, the first not counted twice)", obs)
			}
			if sp.pending() {
				t.Error("spool not empty after the replay")
			}
		})
	}
}

// A batch larger than the whole spool is refused with its size and the
// limit, not as a full spool ("0 bytes of 1048576 used"); a full spool
// says what it holds, of what, and what the batch needs.
func TestSpoolRefusalSaysWhy(t *testing.T) {
	s := &spool{path: filepath.Join(t.TempDir(), "spool.jsonl"), max: 1 << 20}
	big := store.Batch{ID: strings.Repeat("x", 3<<20+100<<10)}
	line, err := json.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("spool cannot take the batch: batch of %.1f MiB is larger than --spool-max 1 MiB: raise --spool-max", float64(len(line)+1)/(1<<20))
	if err := s.add(big); err == nil || err.Error() != want || !errors.Is(err, errBatchTooLarge) {
		t.Errorf("a batch larger than the spool: %v, want %q", err, want)
	}
	if want != "spool cannot take the batch: batch of 3.1 MiB is larger than --spool-max 1 MiB: raise --spool-max" {
		t.Errorf("the batch's size reads %q", want)
	}
	s.max = 2 << 10
	refused := false
	for i := 1; i <= 20 && !refused; i++ {
		used := s.size()
		err := s.add(batch(i))
		if err == nil {
			continue
		}
		line, jerr := json.Marshal(batch(i))
		if jerr != nil {
			t.Fatal(jerr)
		}
		want := fmt.Sprintf("spool full: %s of --spool-max 2 KiB used, the batch needs %d bytes", sizeText(used), len(line)+1)
		if err.Error() != want || !errors.Is(err, errSpoolFull) {
			t.Errorf("a full spool: %v, want %q", err, want)
		}
		refused = true
	}
	if !refused {
		t.Error("a spool of 2 KiB took 20 batches")
	}
	for _, c := range []struct {
		n    int64
		want string
	}{{0, "0 bytes"}, {1023, "1023 bytes"}, {1 << 10, "1 KiB"}, {1536, "1.5 KiB"}, {1 << 20, "1 MiB"}, {3<<20 + 100<<10, "3.1 MiB"}, {256 << 20, "256 MiB"}, {5 << 40, "5 TiB"}, {3 << 50, "3072 TiB"}, {1<<20 - 1, "1.0 MiB"}} {
		if got := sizeText(c.n); got != c.want {
			t.Errorf("sizeText(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

// A batch the spool refuses counts once as refused, though a pinned
// kernel side collects its interval again, under the same batch id, at
// every drain until it is written; another batch counts again.
func TestSpoolCountsARefusedBatchOnce(t *testing.T) {
	s := &spool{path: filepath.Join(t.TempDir(), "spool.jsonl"), max: 64}
	b1, b2 := batch(1), batch(2)
	b1.ID, b2.ID = "batch-1", "batch-2"
	for range 3 {
		if err := s.add(b1); !errors.Is(err, errBatchTooLarge) {
			t.Fatalf("a batch larger than the spool: %v", err)
		}
	}
	if s.dropped != 1 {
		t.Errorf("one batch refused at 3 drains counted %d times, want once", s.dropped)
	}
	if err := s.add(b2); err == nil {
		t.Fatal("a second batch larger than the spool taken")
	}
	if s.dropped != 2 {
		t.Errorf("two batches refused counted %d, want 2", s.dropped)
	}
}

package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
)

// A flow that recurs within ten minutes has its key upserted once (the key
// id cache): a reader whose range starts after the key's first write, in
// the same ten minutes, must still find the flow's later counts, so the
// key's last_seen must cover the whole ten minutes.
func TestKeyCacheKeepsLateStartingRangesRight(t *testing.T) {
	ctx := context.Background()
	step := time.Now().Truncate(10 * time.Minute) // recent: the cache keeps only recent keys
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			// No key pack: it would name the flow without reading
			// last_seen. The remote name is read through last_seen always.
			s.SetAutoCompact(false)
			for _, at := range []time.Duration{5 * time.Second, 7*time.Minute + 25*time.Second} {
				o := obs("web", "outbound", "198.51.100.2", "198.51.100.3", 5432, "nginx", step.Add(at), 3, 10)
				o.RemoteName = "db.example"
				if err := s.Write(ctx, store.Batch{Observations: []store.Observation{o}}); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.Observations(ctx, store.Range{Since: step.Add(7*time.Minute + 20*time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Connections != 3 || got[0].RemoteName != "db.example" {
				t.Fatalf("range from 7 min 20 s into the ten minutes: %+v; want the flow's minute, 3 connections, to db.example", got)
			}
			var seen int64
			if err := s.DB().QueryRowContext(ctx, "SELECT last_seen FROM flow_keys").Scan(&seen); err != nil {
				t.Fatal(err)
			}
			if want := step.Add(10*time.Minute).UnixNano() - 1; seen != want {
				t.Fatalf("flow key last_seen %d, want %d: the end of its ten minutes", seen, want)
			}
		})
	}
}

// Retention that deletes a cached key must not leave its id in the cache:
// SQLite hands a deleted key's id to the next new key, and the old key's
// next write would then count into the new key's rows.
func TestKeyCacheForgetsDeletedKeys(t *testing.T) {
	ctx := context.Background()
	minute := time.Now().Truncate(time.Minute)
	retain := map[string]func(*store.Store) error{
		"Retain": func(s *store.Store) error {
			_, err := s.Retain(ctx, minute.Add(72*time.Hour), store.DefaultBucket)
			return err
		},
		"RetainLevels": func(s *store.Store) error { // the agent's
			_, err := s.RetainLevels(ctx, store.Retention{Minutes: time.Hour, Hours: time.Hour, Days: time.Hour}, minute.Add(72*time.Hour))
			return err
		},
	}
	for name, spec := range backends(t) {
		for how, retain := range retain {
			t.Run(name+"/"+how, func(t *testing.T) {
				s := open(t, spec)
				if _, err := s.DB().ExecContext(ctx, "DELETE FROM flow_minutes"); err != nil { // the other subtest's
					t.Fatal(err)
				}
				a := func(at time.Duration, conns uint64) store.Observation {
					return obs("web", "outbound", "198.51.100.2", "198.51.100.3", 5432, "nginx", minute.Add(at), conns, 1)
				}
				if err := s.Write(ctx, store.Batch{Observations: []store.Observation{a(5*time.Second, 1)}}); err != nil {
					t.Fatal(err)
				}
				// Retention past everything: the key goes with its rows.
				if err := retain(s); err != nil {
					t.Fatal(err)
				}
				b := obs("client", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", minute.Add(6*time.Second), 7, 1)
				if err := s.Write(ctx, store.Batch{Observations: []store.Observation{b}}); err != nil {
					t.Fatal(err)
				}
				if err := s.Write(ctx, store.Batch{Observations: []store.Observation{a(7*time.Second, 2)}}); err != nil {
					t.Fatal(err)
				}
				// Retention hides buckets before its cutoff from queries, so
				// read the rows themselves.
				rows, err := s.DB().QueryContext(ctx, `SELECT k.host_id, k.comm, SUM(m.connections) FROM flow_minutes m
				JOIN flow_keys k ON k.id = m.key_id GROUP BY k.host_id, k.comm`)
				if err != nil {
					t.Fatal(err)
				}
				defer rows.Close()
				conns := map[string]int64{}
				for rows.Next() {
					var host, comm string
					var n int64
					if err := rows.Scan(&host, &comm, &n); err != nil {
						t.Fatal(err)
					}
					conns[host+" "+comm] = n
				}
				if len(conns) != 2 || conns["web nginx"] != 2 || conns["client curl"] != 7 {
					t.Fatalf("minute rows after retention and two writes: %v; want web nginx 2 and client curl 7 connections", conns)
				}
			})
		}
	}
}

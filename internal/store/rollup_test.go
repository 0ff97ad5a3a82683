package store_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// history writes three days of irregular traffic on a few flows, in
// shuffled batches (late writes, as when a spool is replayed), with every
// counter, latencies whose maximum must survive, and listeners.
func history(t *testing.T, s *store.Store, start time.Time) {
	rng := rand.New(rand.NewPCG(1, 2))
	hostsN, flowsN := 3, 4
	var all []store.Observation
	var ls []store.Listener
	for i := 0; i < 3000; i++ {
		at := start.Add(time.Duration(rng.Int64N(int64(72 * time.Hour))))
		h, f := rng.IntN(hostsN), rng.IntN(flowsN)
		o := store.Observation{Bucket: at.Truncate(time.Minute), HostID: fmt.Sprintf("h%d", h), Direction: []string{"outbound", "inbound"}[f%2],
			Proto: []string{"tcp", "udp", "unix"}[f%3], LocalAddr: "198.51.100.1", RemoteAddr: fmt.Sprintf("198.51.100.%d", 10+f), Port: uint16(8000 + f),
			Comm: fmt.Sprintf("p%d", f), PID: uint32(rng.IntN(1000)), PeerPID: uint32(rng.IntN(1000)), PeerComm: fmt.Sprintf("peer%d", f%2),
			FirstSeen: at.Add(-time.Duration(rng.Int64N(int64(10 * time.Second)))), LastSeen: at}
		o.Counters = tracer.Counters{Connections: rng.Uint64N(10), FailedConnections: rng.Uint64N(3), FailedRefused: rng.Uint64N(2), FailedTimeout: rng.Uint64N(2),
			FailedReset: rng.Uint64N(2), FailedUnreachable: rng.Uint64N(2), BytesSent: rng.Uint64N(1e6), BytesReceived: rng.Uint64N(1e6),
			DatagramsSent: rng.Uint64N(50), DatagramsReceived: rng.Uint64N(50), ConnectLatencyCount: rng.Uint64N(10), ConnectLatencySumUs: rng.Uint64N(1e5),
			ConnectLatencyMaxUs: rng.Uint64N(1e6), ResetsSent: rng.Uint64N(3), ResetsReceived: rng.Uint64N(3), Retransmits: rng.Uint64N(20)}
		if n := rng.Uint64N(4); n > 0 { // a quarter of the rows without RTT samples: the minimum skips them
			lo, hi := 1+rng.Uint64N(5000), rng.Uint64N(5000)
			o.RTTSamples, o.RTTMinUs, o.RTTMaxUs, o.RTTSumUs = n, lo, lo+hi, n*lo+hi
		}
		all = append(all, o)
		if i%5 == 0 {
			ls = append(ls, store.Listener{Bucket: at.Truncate(time.Minute), HostID: fmt.Sprintf("h%d", h), Proto: "tcp", LocalAddr: "0.0.0.0",
				Port: uint16(8000 + f), PID: uint32(rng.IntN(1000)), Comm: fmt.Sprintf("p%d", f), BacklogLimit: uint32(rng.IntN(4096)),
				QueueMax: uint32(rng.IntN(100)), Drops: rng.Uint64N(5), FirstSeen: at, LastSeen: at})
		}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	for i := 0; i < len(all); i += 100 {
		b := store.Batch{Observations: all[i:min(i+100, len(all))]}
		if i/100 < len(ls)/20 {
			b.Listeners = ls[i/100*20 : i/100*20+20]
		}
		if err := s.Write(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
}

// Rollups always equal the sum of the raw minute buckets, row by row, and
// a range answered from rollups equals the same range answered from
// minutes only: counters, first/last seen, the latency maximum, listeners;
// also after retention cut into the middle of an hour and a day.
func TestRollupsEqualMinuteBuckets(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 18, 13, 17, 0, 0, time.UTC)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			s.SetAutoCompact(false)
			history(t, s, start)
			// Every past bucket compacted: queries read pieces (the
			// reference, ObservationsFromMinutes, never does).
			if _, err := s.Compact(ctx, start.Add(100*time.Hour)); err != nil {
				t.Fatal(err)
			}
			var cutoff time.Time // of retention, once applied
			check := func(stage string) {
				for table, width := range store.RollupTables() {
					got, err := s.ReadRollup(ctx, table, 0)
					if err != nil {
						t.Fatal(err)
					}
					want, err := s.ReadRollup(ctx, "", width)
					if err != nil {
						t.Fatal(err)
					}
					// Rollup buckets that start before the cutoff straddle it.
					kept := int64(math.MinInt64)
					if !cutoff.IsZero() {
						kept = cutoff.Add(time.Duration(width) - 1).Truncate(time.Duration(width)).UnixNano()
					}
					for _, m := range []map[[2]int64]store.RollupRow{got, want} {
						for k := range m {
							if k[0] < kept {
								delete(m, k)
							}
						}
					}
					if len(want) == 0 || !reflect.DeepEqual(got, want) {
						t.Errorf("%s: %s holds %d rows, the minutes sum to %d; equal: %v", stage, table, len(got), len(want), reflect.DeepEqual(got, want))
					}
				}
				ranges := []store.Range{{}, {Since: start.Add(5 * time.Hour)}, {Until: start.Add(50 * time.Hour)}}
				rng := rand.New(rand.NewPCG(3, 4))
				for i := 0; i < 25; i++ {
					a := start.Add(time.Duration(rng.Int64N(int64(80*time.Hour))) - 4*time.Hour)
					b := a.Add(time.Duration(rng.Int64N(int64(60 * time.Hour))))
					if i%5 == 0 { // aligned ends
						a, b = a.Truncate(time.Hour), b.Truncate(24*time.Hour).Add(24*time.Hour)
					}
					ranges = append(ranges, store.Range{Since: a, Until: b})
				}
				for _, r := range ranges {
					got, err := s.Observations(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					want, err := s.ObservationsFromMinutes(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("%s: range %s – %s: rollups give %d flows, minutes %d, or different counters", stage, r.Since, r.Until, len(got), len(want))
					}
					// The sums themselves (Go for SQLite, sum8 for
					// PostgreSQL) against SQL's SUM, MAX and MIN.
					ref, err := s.ObservationsSQL(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(want, ref) {
						t.Errorf("%s: range %s – %s: minutes summed by the store give %d flows, by SQL's GROUP BY %d, or different counters", stage, r.Since, r.Until, len(want), len(ref))
					}
					gl, err := s.Listeners(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					wl, err := s.ListenersFromMinutes(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					if !reflect.DeepEqual(gl, wl) {
						t.Errorf("%s: range %s – %s: listeners from rollups %+v, from minutes %+v", stage, r.Since, r.Until, gl, wl)
					}
				}
			}
			check("written")
			// Retention in the middle of an hour of the second day. The
			// rollup rows that straddle the cutoff keep their older part
			// until they end, but no query reads them (checked below).
			cutoff = start.Add(30*time.Hour + 17*time.Minute + 20*time.Second)
			if _, err := s.Retain(ctx, cutoff, store.DefaultBucket); err != nil {
				t.Fatal(err)
			}
			check("after retention")
			if _, err := s.Compact(ctx, start.Add(100*time.Hour)); err != nil {
				t.Fatal(err)
			}
			check("after retention, compacted again")
			got, _ := s.Observations(ctx, store.Range{})
			for _, o := range got {
				if o.FirstSeen.Before(start.Add(30*time.Hour + 16*time.Minute)) {
					t.Errorf("retention left %s", o.FirstSeen)
				}
			}
		})
	}
}

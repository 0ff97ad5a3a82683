package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// undoSchema11 takes an open store of schema 12 back to schema 10
// (open_minutes, the RTT columns, flow_names and the DNS tables gone;
// the tests' histories are old, so no minute is open), for the tests of
// upgrades from older schemas, which then undo their own; want (the
// observations read before, []store.Observation or
// [][]store.Observation) loses its RTT and names in place, as the
// upgraded store will have none.
func undoSchema11(t *testing.T, s *store.Store, want any) {
	t.Helper()
	qs := []string{`DROP TABLE open_minutes`, `DROP TABLE flow_names`, `DROP TABLE dns_minutes`, `DROP TABLE dns_hours`, `DROP TABLE dns_days`, `DELETE FROM flow_pieces`}
	for _, tb := range []string{"flow_minutes", "flow_hours", "flow_days"} {
		for _, c := range []string{"rtt_samples", "rtt_sum_us", "rtt_min_us", "rtt_max_us"} {
			qs = append(qs, fmt.Sprintf(`ALTER TABLE %s DROP COLUMN %s`, tb, c))
		}
	}
	qs = append(qs, `DELETE FROM schema_version WHERE version >= 11`)
	for _, q := range qs {
		if _, err := s.DB().ExecContext(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	strip := func(os []store.Observation) {
		for i := range os {
			os[i].RTTSamples, os[i].RTTSumUs, os[i].RTTMinUs, os[i].RTTMaxUs, os[i].RemoteName = 0, 0, 0, 0, ""
		}
	}
	switch w := want.(type) {
	case []store.Observation:
		strip(w)
	case [][]store.Observation:
		for _, os := range w {
			strip(os)
		}
	default:
		t.Fatalf("undoSchema11: want is a %T", want)
	}
}

var resolver = "127.0.0.53:53"

// dnsBatch: curl on client resolving through the local stub, one
// NXDOMAIN and one timeout; the checkout pod through the cluster's
// resolver over udp and tcp; and a named external flow.
func dnsBatch(at time.Time) store.Batch {
	b := fleet(at)
	b.Observations[4].RemoteName = "dns.example.net"
	b.DNS = []store.DNSObservation{
		{Bucket: at.Truncate(time.Minute), HostID: "client", Comm: "curl", PID: 7, Proto: "udp", Resolver: resolver,
			DNSCounters: tracer.DNSCounters{Queries: 10, Answers: 9, NoError: 8, NXDomain: 1, Timeouts: 1, LatencyCount: 9, LatencySumUs: 900, LatencyMaxUs: 300},
			FirstSeen:   at, LastSeen: at.Add(time.Second)},
		{Bucket: at.Truncate(time.Minute), HostID: "client", Comm: "checkout", PID: 8, Identity: checkoutID, Proto: "udp", Resolver: "10.96.0.10:53",
			DNSCounters: tracer.DNSCounters{Queries: 4, Answers: 4, NoError: 2, ServFail: 1, OtherErrors: 1, LatencyCount: 4, LatencySumUs: 400, LatencyMaxUs: 200, Unparsed: 1},
			FirstSeen:   at, LastSeen: at.Add(2 * time.Second)},
		{Bucket: at.Truncate(time.Minute), HostID: "client", Comm: "checkout", PID: 8, Identity: checkoutID, Proto: "tcp", Resolver: "10.96.0.10:53",
			DNSCounters: tracer.DNSCounters{Queries: 1, Answers: 1, NoError: 1, LatencyCount: 1, LatencySumUs: 50, LatencyMaxUs: 50},
			FirstSeen:   at, LastSeen: at.Add(2 * time.Second)},
	}
	return b
}

// DNS counters are summed per client and resolver over a range, the
// latency maximum kept; a replayed batch counts once; identities come
// from end_identities; retention removes them with the flows.
func TestDNSRoundTrip(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			first := dnsBatch(t0)
			first.ID = "agent-1/1"
			for range 2 { // the second is a replay: skipped
				if err := s.Write(ctx, first); err != nil {
					t.Fatal(err)
				}
			}
			later := dnsBatch(t0.Add(90 * time.Minute)) // another hour
			later.DNS = later.DNS[:1]
			later.DNS[0].LatencyMaxUs, later.DNS[0].PID = 5000, 70
			if err := s.Write(ctx, later); err != nil {
				t.Fatal(err)
			}
			got, err := s.DNS(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			curl := first.DNS[0]
			curl.DNSCounters.Add(later.DNS[0].DNSCounters)
			curl.PID, curl.Bucket, curl.LastSeen = 70, time.Time{}, later.DNS[0].LastSeen
			pod, podTCP := first.DNS[1], first.DNS[2]
			pod.Bucket, podTCP.Bucket = time.Time{}, time.Time{}
			want := []store.DNSObservation{podTCP, pod, curl} // tcp before udp
			if !reflect.DeepEqual(got, want) {
				t.Errorf("DNS:\n got %+v\nwant %+v", got, want)
			}
			if got[2].Queries != 20 || got[2].LatencyMaxUs != 5000 || got[2].Failed() != 4 {
				t.Errorf("curl summed: %+v", got[2])
			}
			// From the rollups as from the minutes, for a range of whole
			// hours and one cut inside minutes.
			for _, r := range []store.Range{{Since: t0, Until: t0.Add(3 * time.Hour)}, {Since: t0.Add(30 * time.Second), Until: t0.Add(100 * time.Minute)}, {Since: t0.Add(time.Hour)}} {
				a, err := s.DNS(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				b, err := s.DNSFromMinutes(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(a, b) {
					t.Errorf("range %v: rollups %+v, minutes %+v", r, a, b)
				}
			}
			if got, err := s.DNS(ctx, store.Range{Since: t0.Add(time.Hour)}); err != nil || len(got) != 1 || got[0].Queries != 10 || got[0].LatencyMaxUs != 5000 {
				t.Errorf("the later hour only: %+v, %v", got, err)
			}
			if _, err := s.Retain(ctx, t0.Add(72*time.Hour), store.DefaultBucket); err != nil {
				t.Fatal(err)
			}
			if got, err := s.DNS(ctx, store.Range{}); err != nil || len(got) != 0 {
				t.Errorf("after retention: %+v, %v", got, err)
			}
		})
	}
}

// A DNS record without a host or resolver is left out; the rest of the
// batch is written.
func TestDNSWithoutResolverIsLeftOut(t *testing.T) {
	s := open(t, t.TempDir()+"/deptrace.db")
	b := dnsBatch(t0)
	b.DNS = append(b.DNS, store.DNSObservation{Bucket: t0, HostID: "client", Comm: "curl", Proto: "udp", DNSCounters: tracer.DNSCounters{Queries: 1}},
		store.DNSObservation{Bucket: t0, Comm: "curl", Proto: "udp", Resolver: resolver, DNSCounters: tracer.DNSCounters{Queries: 1}})
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	got, err := s.DNS(context.Background(), store.Range{})
	if err != nil || len(got) != 3 {
		t.Errorf("%+v, %v", got, err)
	}
}

// Each flow key keeps the latest non-empty remote name: a later record
// without one does not erase it, a later name replaces it, an older one
// written late does not.
func TestRemoteNamesPerFlow(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			ext := func(at time.Time, name string) store.Batch {
				o := obs("web", "outbound", "198.51.100.2", "203.0.113.7", 443, "nginx", at, 1, 10)
				o.RemoteName = name
				return store.Batch{Observations: []store.Observation{o}}
			}
			name := func() string {
				t.Helper()
				os, err := s.Observations(ctx, store.Range{})
				if err != nil || len(os) != 1 {
					t.Fatalf("%+v, %v", os, err)
				}
				return os[0].RemoteName
			}
			for _, step := range []struct {
				b    store.Batch
				want string
			}{
				{ext(t0, "api.example.com"), "api.example.com"},
				{ext(t0.Add(time.Minute), ""), "api.example.com"},
				{ext(t0.Add(2*time.Minute), "cdn.example.com"), "cdn.example.com"},
				{ext(t0.Add(-time.Minute), "old.example.com"), "cdn.example.com"},
			} {
				if err := s.Write(ctx, step.b); err != nil {
					t.Fatal(err)
				}
				if got := name(); got != step.want {
					t.Errorf("after %s: name %q, want %q", step.b.Observations[0].RemoteName, got, step.want)
				}
			}
			// Retention that forgets the key forgets its name.
			if _, err := s.Retain(ctx, t0.Add(72*time.Hour), store.DefaultBucket); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := s.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM flow_names`).Scan(&n); err != nil || n != 0 {
				t.Errorf("names after retention: %d, %v", n, err)
			}
		})
	}
}

// A store of schema 10 (before RTT, names and DNS) opens, migrates and
// keeps its flows and their counters, with no RTT; pieces built before
// are rebuilt; RTT, names and DNS written after the upgrade are read
// back, from pieces too.
func TestUpgradeToRTTAndDNS(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 18, 13, 17, 0, 0, time.UTC)
	ranges := randomRanges(start, 21, 10)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := quiet(t, spec)
			history(t, s, start)
			var want [][]store.Observation
			for _, r := range ranges {
				o, err := s.ObservationsFromMinutes(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, o)
			}
			undoSchema11(t, s, want)
			if v, err := s.Version(ctx); err != nil || v != 10 {
				t.Fatalf("made schema %d (%v), want 10", v, err)
			}
			s.Close()

			u := quiet(t, spec)
			if v, err := u.Version(ctx); err != nil || v != store.SchemaVersion || v < 11 {
				t.Fatalf("after upgrade: schema %d (%v), want %d", v, err, store.SchemaVersion)
			}
			for i, r := range ranges {
				got, err := u.Observations(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want[i]) {
					t.Errorf("range %s – %s: %d flows, before the upgrade %d, or different counters", r.Since, r.Until, len(got), len(want[i]))
				}
			}
			if err := u.Write(ctx, dnsBatch(start.Add(time.Hour))); err != nil {
				t.Fatal(err)
			}
			if st, err := u.Compact(ctx, start.Add(100*time.Hour)); err != nil || st.Pieces == 0 {
				t.Fatalf("compaction after the upgrade: %+v, %v", st, err)
			}
			if _, _, err := u.PiecesMatchRows(ctx); err != nil {
				t.Fatal(err)
			}
			sameAnswers(t, u, "upgraded and compacted", ranges)
			os, err := u.Observations(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			named, rtt := 0, 0
			for _, o := range os {
				if o.RemoteName == "dns.example.net" {
					named++
				}
				if o.RTTSamples > 0 {
					rtt++
				}
			}
			if named != 1 || rtt != 0 {
				t.Errorf("after the upgrade: %d flows named (want 1), %d with RTT (want 0)", named, rtt)
			}
			if d, err := u.DNS(ctx, store.Range{}); err != nil || len(d) != 3 {
				t.Errorf("DNS after the upgrade: %+v, %v", d, err)
			}
		})
	}
}

// The RTT's minimum merges as the minimum over records with samples
// through minutes, hours, days and pieces, the maximum as a maximum and
// the sum and samples as sums: random rows, some without samples, read
// from pieces and rollups equal the Go sum of the same records.
func TestRTTMergesThroughRollupsAndPieces(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 18, 0, 0, 0, 0, time.UTC)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := quiet(t, spec)
			rng := rand.New(rand.NewPCG(5, 6))
			want := map[string]tracer.Counters{}
			var all []store.Observation
			for i := 0; i < 600; i++ {
				at := start.Add(time.Duration(rng.Int64N(int64(50 * time.Hour))))
				f := rng.IntN(3)
				o := obs("web", "outbound", "198.51.100.2", fmt.Sprintf("203.0.113.%d", f), 443, "nginx", at, 1, 1)
				if rng.IntN(3) > 0 {
					lo := 10 + rng.Uint64N(100000)
					o.RTTSamples, o.RTTMinUs, o.RTTMaxUs, o.RTTSumUs = 2, lo, lo+rng.Uint64N(1000), 2*lo+rng.Uint64N(1000)
				}
				c := want[o.RemoteAddr]
				c.Add(o.Counters)
				want[o.RemoteAddr] = c
				all = append(all, o)
			}
			for i := 0; i < len(all); i += 50 {
				if err := s.Write(ctx, store.Batch{Observations: all[i:min(i+50, len(all))]}); err != nil {
					t.Fatal(err)
				}
			}
			check := func(stage string) {
				got, err := s.Observations(ctx, store.Range{})
				if err != nil || len(got) != 3 {
					t.Fatalf("%s: %d flows, %v", stage, len(got), err)
				}
				for _, o := range got {
					w := want[o.RemoteAddr]
					if o.RTTSamples != w.RTTSamples || o.RTTSumUs != w.RTTSumUs || o.RTTMinUs != w.RTTMinUs || o.RTTMaxUs != w.RTTMaxUs {
						t.Errorf("%s: %s: rtt %d/%d/%d/%d, want %d/%d/%d/%d", stage, o.RemoteAddr, o.RTTSamples, o.RTTSumUs, o.RTTMinUs, o.RTTMaxUs,
							w.RTTSamples, w.RTTSumUs, w.RTTMinUs, w.RTTMaxUs)
					}
				}
			}
			check("rows")
			if _, err := s.Compact(ctx, start.Add(100*time.Hour)); err != nil {
				t.Fatal(err)
			}
			check("pieces")
			s.EnableCache(store.CacheConfig{Now: func() time.Time { return start.Add(100 * time.Hour) }})
			check("cache, filling")
			check("cache")
		})
	}
}

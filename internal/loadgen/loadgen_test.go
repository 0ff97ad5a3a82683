package loadgen

import (
	"context"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestScheduleHoldsTheRate(t *testing.T) {
	start := time.Unix(1000, 0)
	s := NewSchedule(100, start, 100*time.Millisecond) // one every 10 ms
	now := start
	for i := 0; i < 100; i++ {
		d, missed := s.Next(now)
		if missed != 0 {
			t.Fatalf("start %d: %d missed on time", i, missed)
		}
		now = now.Add(d + time.Millisecond) // each round trip takes 1 ms
	}
	// 100 round trips at 100/s take about 1 s whatever their own length.
	if got := now.Sub(start); got < 990*time.Millisecond || got > 1010*time.Millisecond {
		t.Errorf("100 paced round trips took %s, want ~1s", got)
	}
}

// Starts a short stall delayed are caught up; those more than the slack
// late are dropped and counted, and the schedule goes on from there.
func TestScheduleCatchesUpWithinSlackAndCountsTheRest(t *testing.T) {
	start := time.Unix(1000, 0)
	s := NewSchedule(1000, start, 100*time.Millisecond) // every 1 ms
	now := start.Add(50 * time.Millisecond)             // a 50 ms stall: within the slack
	for i := 0; i < 51; i++ {
		if d, missed := s.Next(now); d != 0 || missed != 0 {
			t.Fatalf("catching up start %d: wait %s, missed %d", i, d, missed)
		}
	}
	if d, _ := s.Next(now); d != time.Millisecond {
		t.Errorf("after catching up the next start waits %s, want 1ms", d)
	}
	now = start.Add(1000 * time.Millisecond) // 948 ms behind: all but the last 100 ms dropped
	d, missed := s.Next(now)
	if d != 0 || missed < 845 || missed > 850 {
		t.Errorf("after a 1 s stall: wait %s, %d missed, want 0 and about 847", d, missed)
	}
	var n uint64
	for ; n < 200; n++ {
		if d, m := s.Next(now); d > 0 || m != 0 {
			break
		}
	}
	if n < 95 || n > 101 {
		t.Errorf("%d starts caught up after the stall, want the slack's 100", n)
	}
	if d, m := NewSchedule(0, start, time.Second).Next(start); d != 0 || m != 0 {
		t.Errorf("rate 0 waits %s, missed %d", d, m)
	}
}

func TestSourceIndexUsesEverySource(t *testing.T) {
	for _, c := range []struct{ addrs, sources int }{{1, 1000}, {3, 10}, {4, 6}, {10, 3}} {
		pairs := map[[2]uint64]bool{}
		srcs := map[uint64]bool{}
		for i := uint64(0); i < uint64(c.addrs*c.sources); i++ {
			src := sourceIndex(i, c.addrs, c.sources)
			if src >= uint64(c.sources) {
				t.Fatalf("%+v: source %d out of range", c, src)
			}
			srcs[src] = true
			pairs[[2]uint64{i % uint64(c.addrs), src}] = true
		}
		if len(srcs) != c.sources || len(pairs) != c.addrs*c.sources {
			t.Errorf("%d servers, %d sources: %d sources used, %d pairs, want all", c.addrs, c.sources, len(srcs), len(pairs))
		}
	}
}

func TestSources(t *testing.T) {
	s, err := Sources(300)
	if err != nil || len(s) != 300 {
		t.Fatal(err)
	}
	if s[0].String() != "127.1.0.1" || s[254].String() != "127.1.0.255" || s[299].String() != "127.1.1.44" {
		t.Errorf("%s %s %s", s[0], s[254], s[299])
	}
	seen := map[string]bool{}
	for _, a := range s {
		if seen[a.String()] || !a.IsLoopback() {
			t.Fatalf("%s repeated or not loopback", a)
		}
		seen[a.String()] = true
	}
	if _, err := Sources(70000); err == nil {
		t.Error("70000 sources accepted")
	}
}

func TestMergeEdgesSumsWorkers(t *testing.T) {
	per := []map[edgeKey]uint64{
		{{client: "127.1.0.1", server: "127.0.0.1:7000"}: 3, {client: "127.1.0.2", server: "127.0.0.1:7000"}: 1},
		{{client: "127.1.0.1", server: "127.0.0.1:7000"}: 2, {client: "127.1.0.1", server: "[::1]:7001"}: 5},
	}
	got := mergeEdges(per, "tcp")
	if len(got) != 3 {
		t.Fatalf("%+v", got)
	}
	if got[0].Client != "127.1.0.1" || got[0].Server != "127.0.0.1" || got[0].Port != 7000 || got[0].RoundTrips != 5 || got[0].Proto != "tcp" {
		t.Errorf("first edge %+v", got[0])
	}
	if got[1].Server != "::1" || got[1].Port != 7001 {
		t.Errorf("ipv6 edge %+v", got[1])
	}
}

func TestValidate(t *testing.T) {
	ok := Config{Workload: TCPShort, Addrs: []string{"127.0.0.1:1"}, Concurrency: 1, MsgSize: 1, Duration: time.Second}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := ok
	bad.Workload = "sctp"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "tcp-short") {
		t.Errorf("workload: %v", err)
	}
	bad = ok
	bad.Rate = -1
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "rate") {
		t.Errorf("rate: %v", err)
	}
}

// A run that completes no round trip names why: the first error, here a
// refused connection, not only that none completed.
func TestRunNamesWhyNoRoundTripCompleted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now: connect is refused
	_, err = Run(context.Background(), Config{Workload: TCPShort, Addrs: []string{closed}, Concurrency: 1, Rate: 50, MsgSize: 16, Duration: 200 * time.Millisecond})
	if err == nil || !regexp.MustCompile(`^no round trip completed: dial tcp `+regexp.QuoteMeta(closed)+`: connect: connection refused \(all \d+ attempts failed\)$`).MatchString(err.Error()) {
		t.Errorf("error %v, want the refused connect named", err)
	}
}

// A real run on loopback: the ground truth holds exactly the pairs used,
// and a rate beyond reach is reported as not reached.
func TestRunKeepsGroundTruth(t *testing.T) {
	ctx := context.Background()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	addrs, err := Serve(ctx, "127.0.0.1:0", 1)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := Sources(4)
	for _, w := range Workloads {
		r, err := Run(ctx, Config{Workload: w, Addrs: addrs, Sources: src, Concurrency: 4, Rate: 300, MsgSize: 16, Duration: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for _, e := range r.Edges {
			sum += e.RoundTrips
			if !strings.HasPrefix(e.Client, "127.1.0.") || e.Server != "127.0.0.1" {
				t.Errorf("%s edge %+v", w, e)
			}
		}
		// Every source is used, with one server too.
		if sum != r.RoundTrips || len(r.Edges) != 4 {
			t.Errorf("%s: %d edges summing to %d of %d round trips, want 4 edges (one per source)", w, len(r.Edges), sum, r.RoundTrips)
		}
		if r.Clients != 4 || r.Mean <= 0 || r.Max < r.P99 {
			t.Errorf("%s: clients %d, mean %s, max %s, p99 %s", w, r.Clients, r.Mean, r.Max, r.P99)
		}
		// Whether 300/s is reached depends on how busy the machine is
		// (it was not, once, beside a qemu guest): only that the report
		// agrees with the rate it measured is asserted.
		if r.Reached != (r.Rate >= 0.95*300) {
			t.Errorf("%s: reached=%v at %.0f/s of 300/s", w, r.Reached, r.Rate)
		}
	}
	r, err := Run(ctx, Config{Workload: TCPShort, Addrs: addrs, Concurrency: 1, Rate: 5_000_000, MsgSize: 16, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Reached {
		t.Errorf("5M connections/s from one client reported as reached (%.0f/s)", r.Rate)
	}
}

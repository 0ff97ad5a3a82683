package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/deptrace/deptrace/bench/internal/measure"
	"github.com/deptrace/deptrace/internal/testnet"
)

// A short, real sweep: every method produces records from real traffic and
// recall is computed against the load's ground truth.
func TestCompareSmoke(t *testing.T) {
	testnet.RequireRoot(t)
	out := t.TempDir()
	_, stderr, code := run(t, nil, "compare", "--workloads", "tcp-persistent,tcp-short", "--rates", "200",
		"--peers", "5", "--peers-rate", "200", "--peers-workload", "udp", "--duration", "1s", "--persistent", "4", "--concurrency", "2", "--out", out,
		// Polling sees only what is open at a snapshot: several snapshots
		// must fall inside the 1 s load (at the default 1 s interval the
		// first could come after the load ended: failed once in CI).
		"--interval", "200ms")
	if code != 0 {
		t.Fatalf("compare failed:\n%s", stderr)
	}
	rows, err := measure.ReadResults(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3*len(measure.Methods) {
		t.Fatalf("%d rows, want %d", len(rows), 3*len(measure.Methods))
	}
	for _, r := range rows {
		if r.TrueEdges == 0 || r.Rate < 150 {
			t.Errorf("%s %s: load did not run: %+v", r.Workload, r.Method, r)
		}
		if r.Workload == "tcp-persistent" && (r.Records == 0 || r.Recall != 1) {
			t.Errorf("%s on persistent connections: %d records, recall %.2f; every method should see them", r.Method, r.Records, r.Recall)
		}
		if r.Method != measure.Polling {
			if r.Recall != 1 {
				t.Errorf("%s %s: recall %.3f (%d of %d edges), want 1", r.Workload, r.Method, r.Recall, r.FoundEdges, r.TrueEdges)
			}
			if r.KernelNsPerRT <= 0 {
				t.Errorf("%s %s: no kernel time measured", r.Workload, r.Method)
			}
			// bpf_stats' floor measured in the same run: the net
			// figures are below the measured ones by runs × floor.
			if !r.NetMeasured() || r.NetKernelNsPerRT() >= r.KernelNsPerRT {
				t.Errorf("%s %s: no net kernel time (%.1f runs per round trip, floor %.1f ns, net %.0f of %.0f ns)",
					r.Workload, r.Method, r.KernelRunsPerRT, r.FloorNs, r.NetKernelNsPerRT(), r.KernelNsPerRT)
			}
		}
	}
	for _, f := range []string{"results.csv", "cpu-total-tcp-short.png", "recall-tcp-short.png", "peers-cpu.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing: %v", f, err)
		}
	}
}

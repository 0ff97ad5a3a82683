package bundler

import (
	"slices"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/kernel"
)

// Both ways the copies decide (the per-CPU flag of kernels before 6.19,
// the task marks of 6.19+) count every TCP state change once: a copy that
// did work the first copy did would double the connections, one that
// skipped work would lose them. The copies must be attached, in order.
func TestCopiesCountEachStateChangeOnce(t *testing.T) {
	// This kernel's own mode (the flag before 6.19), then marks forced.
	// From 6.19 the kernel's own mode is the marks: forcing them would
	// load and count the same configuration twice (30 s under TCG).
	for _, force := range []bool{false, true} {
		if force && kernel.ReleaseAtLeast(6, 19) {
			continue
		}
		marks := force || kernel.ReleaseAtLeast(6, 19)
		name := "own"
		if force {
			name = "marks"
		}
		want := []string{"on_tcp_state_last"}
		if marks {
			want = []string{"on_tcp_state_mid1", "on_tcp_state_last"}
		}
		t.Run(name, func(t *testing.T) {
			testHooks.recMarks = force
			defer func() { testHooks.recMarks = false }()
			world := newCommitWorld(t, 7400)
			bu := mustLoad(t, testConfig())
			defer bu.Close()
			for _, h := range bu.Hooks() {
				if h.Program == "on_tcp_state" && !slices.Equal(h.Copies, want) {
					t.Fatalf("on_tcp_state copies %v (%s), want %v", h.Copies, h.CopiesMissing, want)
				}
				if (h.Program == "on_send" || h.Program == "on_recv") && h.Active {
					wantSend := []string(nil)
					if marks {
						wantSend = []string{h.Program + "_mid1", h.Program + "_last"}
					}
					if !slices.Equal(h.Copies, wantSend) {
						t.Fatalf("%s copies %v (%s), want %v", h.Program, h.Copies, h.CopiesMissing, wantSend)
					}
				}
			}
			if _, err := bu.Seed(); err != nil {
				t.Fatal(err)
			}
			const workers, each = 8, 40
			world.connectConcurrently(workers, each, []byte("x"))
			var conns, received uint64
			deadline := time.Now().Add(10 * time.Second)
			for (conns < workers*each || received < workers*each) && time.Now().Before(deadline) {
				entries, _, err := bu.Drain()
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range entries {
					if e.NetNS == world.client.Inode && e.Direction == DirOutbound && e.Port == 7400 {
						conns += e.Connections
					}
					if e.NetNS != world.client.Inode && e.Direction == DirInbound && e.Port == 7400 {
						received += e.BytesReceived
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !countedOnce(t, bu, workers*each, conns, received) {
				t.Fatalf("client connections %d, server bytes received %d, want %d of each (%s)", conns, received, workers*each, lossReport(bu))
			}
			st, err := bu.Stats()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("recursion: %d recovered by copies, %d lost", st.RecursionRecovered, st.RecursionMisses)
		})
	}
}

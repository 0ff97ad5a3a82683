package bundler

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// A connect() is remembered until its connection opens, for the connect
// latency and the connecting process: in a slot of the connect array, or in
// the connecting hash where the slot is taken. Both paths give every
// connection, its latency and its process, with connects racing each other.
func TestConnectsRememberedInSlotsAndHash(t *testing.T) {
	for _, hash := range []bool{false, true} {
		name := "slots"
		if hash {
			name = "hash"
		}
		t.Run(name, func(t *testing.T) {
			testHooks.connectHash = hash
			defer func() { testHooks.connectHash = false }()
			world := newCommitWorld(t, 7300)

			bu := mustLoad(t, testConfig())
			defer bu.Close()
			if _, err := bu.Seed(); err != nil {
				t.Fatal(err)
			}
			const workers, each = 8, 25
			world.connectConcurrently(workers, each, nil)

			var got struct{ Connections, LatencyCount, LatencySumUs, LatencyMaxUs uint64 }
			var pid uint32
			deadline := time.Now().Add(10 * time.Second)
			for got.Connections < workers*each && time.Now().Before(deadline) {
				entries, _, err := bu.Drain()
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range entries {
					if e.NetNS == world.client.Inode && e.Direction == DirOutbound && e.Port == 7300 {
						got.Connections += e.Connections
						got.LatencyCount += e.LatencyCount
						got.LatencySumUs += e.LatencySumUs
						got.LatencyMaxUs = max(got.LatencyMaxUs, e.LatencyMaxUs)
						pid = e.PID
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !countedWithLatency(t, bu, workers*each, got.Connections, got.LatencyCount) {
				t.Fatalf("connections %d, latencies %d, want %d of each (%s)", got.Connections, got.LatencyCount, workers*each, lossReport(bu))
			}
			if got.LatencySumUs == 0 || got.LatencyMaxUs == 0 {
				t.Errorf("latency sum %d µs, max %d µs: not measured", got.LatencySumUs, got.LatencyMaxUs)
			}
			if pid != uint32(os.Getpid()) {
				t.Errorf("connections named pid %d, want the test's %d", pid, os.Getpid())
			}
		})
	}
}

// countedOnce reports whether counts the kernel side kept under
// concurrent connects are what the traffic did (want each), and logs a
// reported loss. Each of got must need its own calls of the programs (a
// client's connections and the server's receives, not a connection and
// its latency, which one call counts). Where tracepoint programs are
// preemptible (task marks, 6.19+), a call the kernel skipped in every copy
// (another task preempted inside each, on that CPU) is lost and counted
// (recmarks.h): there the shortfalls together may reach the calls
// reported lost, an upper bound. With the per-CPU flag nothing here can
// be lost, and a rescue that failed would be reported as a loss: exact.
// Never more than want.
func countedOnce(t *testing.T, bu *Bundler, want uint64, got ...uint64) bool {
	t.Helper()
	s, err := bu.Stats()
	if err != nil {
		t.Fatal(err)
	}
	var short uint64
	for _, g := range got {
		if g > want {
			return false
		}
		short += want - g
	}
	if short == 0 {
		return true
	}
	if !recTaskMarks() || short > s.RecursionMisses {
		return false
	}
	t.Logf("%d of %d lost for recursion, within the %d reported", short, want*uint64(len(got)), s.RecursionMisses)
	return true
}

// countedWithLatency is countedOnce for a client's connections and their
// connect latencies: one call counts both (the latency only where the
// connect's call was not lost too), so the latencies carry the shortfall.
func countedWithLatency(t *testing.T, bu *Bundler, want, conns, latencies uint64) bool {
	t.Helper()
	return conns <= want && latencies <= conns && countedOnce(t, bu, want, latencies)
}

// lossReport says what the kernel side lost, for a failure message: the loss
// counters and every program the kernel skipped runs of.
func lossReport(bu *Bundler) string {
	s, err := bu.Stats()
	if err != nil {
		return "stats: " + err.Error()
	}
	out := fmt.Sprintf("flow map full %d, flow alloc failed %d, sock storage failed %d, recursion misses %d",
		s.FlowMapFull, s.FlowAllocFailed, s.SockStorageFailed, s.RecursionMisses)
	for name, p := range s.Programs {
		if p.RecursionMisses > 0 {
			out += fmt.Sprintf(", %s missed %d", name, p.RecursionMisses)
		}
	}
	return out
}

// connectConcurrently has workers goroutines open each connections to the
// server, one after the other, writing payload (if any) before closing.
func (w *commitWorld) connectConcurrently(workers, each int, payload []byte) {
	w.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				c, err := w.client.Dial("tcp4", w.server)
				if err != nil {
					errs <- err
					return
				}
				if payload != nil {
					_, _ = c.Write(payload) // a short write shows in the counts checked
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		w.t.Fatal(err)
	}
}

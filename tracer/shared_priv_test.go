package tracer_test

import (
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/tracer"
)

// sharedLoadEnv set to 1 makes the tests that start with startSharedTracer
// share one load of the kernel side, and checks at the end that every
// program it attached ran at least once. The kernel matrix's CI tier sets
// it: under TCG one load takes about 30 s, longer than most tests' traffic.
// Without it (the host suite, the full matrix) every test loads its own.
const sharedLoadEnv = "DEPTRACE_TEST_SHARED_LOAD"

var shared struct {
	once sync.Once
	tr   *tracer.Tracer
	err  error
	// stats keeps kernel.bpf_stats_enabled on while the binary runs.
	stats io.Closer
}

func sharedLoad() bool { return os.Getenv(sharedLoadEnv) == "1" }

// startSharedTracer is startTracer with the default configuration for a
// test that creates every socket after the tracer starts (a test that
// needs sockets from before the start, or another configuration, loads
// its own). Under sharedLoadEnv the load is shared: what earlier tests
// left in the kernel side is drained and dropped first, and the tracer
// stays open for the next test. Tests key their ledgers on their own
// hosts' namespaces, so another test's flows never reach their counts.
func startSharedTracer(t *testing.T) *tracer.Tracer {
	t.Helper()
	if !sharedLoad() {
		return startTracer(t, nil)
	}
	// Loaded outside any test's cleanup: it outlives the test that
	// happens to load it, and runShared closes it.
	shared.once.Do(func() { shared.tr, shared.err = loadShared() })
	if shared.err != nil {
		t.Fatalf("shared tracer: %v", shared.err)
	}
	// Whatever earlier tests left behind goes before this test counts.
	if _, err := shared.tr.Collect(); err != nil {
		t.Fatalf("collect before the test: %v", err)
	}
	return shared.tr
}

// loadShared loads the tracer with startTracer's configuration and checks.
func loadShared() (*tracer.Tracer, error) {
	cfg := tracer.DefaultConfig()
	cfg.SyscallTracepoints = true
	tr, err := tracer.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("load tracer: %w", err)
	}
	hooks := tr.Hooks()
	for _, h := range hooks {
		if !tracer.Covered(h, hooks) {
			tr.Close()
			return nil, fmt.Errorf("hook %s inactive and not replaced on this kernel: %s", h.Hook, h.Reason)
		}
	}
	if _, _, err := tr.Seeded(); err != nil {
		tr.Close()
		return nil, fmt.Errorf("seed: %w", err)
	}
	return tr, nil
}

// runShared runs the tests; under sharedLoadEnv it turns bpf_stats on for
// the run and afterwards fails the binary, with a FAIL line the kernel
// matrix reads, if a program of the shared load never ran: a hook path of
// this kernel that the tests did not exercise.
func runShared(m *testing.M) int {
	if !sharedLoad() {
		return m.Run()
	}
	if st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME); err == nil {
		shared.stats = st
	} else {
		fmt.Fprintf(os.Stderr, "%s: cannot enable bpf_stats: %v\n", sharedLoadEnv, err)
		return 1
	}
	code := m.Run()
	if shared.tr == nil {
		return code
	}
	defer shared.tr.Close()
	defer shared.stats.Close()
	st, err := shared.tr.Stats()
	fmt.Println("=== RUN   TestEveryAttachedProgramRan")
	var idle []string
	for _, h := range shared.tr.Hooks() {
		if !h.Active {
			continue
		}
		p := st.Programs[h.Program]
		fmt.Printf("    shared_priv_test.go:1: %s (%s): %d runs\n", h.Program, h.Hook, p.RunCount)
		if p.RunCount == 0 {
			idle = append(idle, h.Program)
		}
	}
	sort.Strings(idle)
	if err != nil || len(idle) > 0 {
		fmt.Println("--- FAIL: TestEveryAttachedProgramRan (0.00s)")
		if err != nil {
			fmt.Printf("    shared_priv_test.go:1: stats: %v\n", err)
		}
		fmt.Printf("    shared_priv_test.go:1: attached but never ran in these tests: %v\n", idle)
		return 1
	}
	fmt.Println("--- PASS: TestEveryAttachedProgramRan (0.00s)")
	return code
}

package tracer_test

import (
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// sharedLoadEnv set to 1 makes the tests that start with startSharedTracer
// share one load of the kernel side, and checks at the end that every
// program it attached ran at least once. The kernel matrix's CI tier sets
// it: under TCG one load takes about 30 s, longer than most tests' traffic.
// Without it (the host suite, the full matrix) every test loads its own.
const sharedLoadEnv = "DEPTRACE_TEST_SHARED_LOAD"

var shared struct {
	mu sync.Mutex
	tr *tracer.Tracer
	// runs sums each program's run count over the shared loads closed so
	// far; attached names the programs any of them attached.
	runs     map[string]uint64
	attached map[string]string
	// stats keeps kernel.bpf_stats_enabled on while the binary runs.
	stats io.Closer
	// sharedPass is set while the tests that share the load run
	// (runFirstPassFirst).
	sharedPass bool
}

func sharedLoad() bool { return os.Getenv(sharedLoadEnv) == "1" }

// startSharedTracer is startTracer with the default configuration for a
// test that creates every socket after the tracer starts (a test that
// needs another configuration loads its own; one with sockets from before
// the start uses startSharedTracerAfter). Under sharedLoadEnv the load is
// shared: what earlier tests left in the kernel side is drained and
// dropped first, and the tracer stays open for the next test. Tests key
// their ledgers on their own hosts' namespaces, so another test's flows
// never reach their counts.
func startSharedTracer(t *testing.T) *tracer.Tracer {
	t.Helper()
	if !sharedLoad() {
		return startTracer(t, nil)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.tr == nil {
		loadSharedLocked(t)
	}
	// Whatever earlier tests left behind goes before this test counts.
	if _, err := shared.tr.Collect(); err != nil {
		t.Fatalf("collect before the test: %v", err)
	}
	return shared.tr
}

// startSharedTracerAfter is startSharedTracer for a test whose sockets
// were opened before the start. Under the shared load, when none is loaded
// yet (the test runs in the first pass, firstPassTests), it makes the
// shared load and returns it undrained: the first interval is the test's
// own, and holds what seeding at the start got wrong, if anything. Else
// the test loads its own, as without the shared load.
func startSharedTracerAfter(t *testing.T) *tracer.Tracer {
	t.Helper()
	if !sharedLoad() {
		return startTracer(t, nil)
	}
	shared.mu.Lock()
	if shared.tr == nil {
		defer shared.mu.Unlock()
		loadSharedLocked(t)
		return shared.tr
	}
	shared.mu.Unlock()
	return startTracer(t, nil)
}

// loadSharedLocked makes the shared load (shared.mu held). It is loaded
// outside any test's cleanup: it outlives the test that happens to load
// it, until a test loads its own (closeShared) or the binary ends
// (runShared).
func loadSharedLocked(t *testing.T) {
	t.Helper()
	tr, err := loadShared()
	if err != nil {
		t.Fatalf("shared tracer: %v", err)
	}
	shared.tr = tr
}

// closeShared unloads the shared tracer, if one is loaded, keeping its
// programs' run counts. A test that loads its own tracer calls it first:
// two deptraces at once are not what the test checks (the second finds the
// first's socket storage on every connection and tags live connections
// only during one jiffy in 32, bpf/bundler.bpf.c udp_datagram).
func closeShared() (unloaded bool) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.tr == nil {
		return false
	}
	if shared.runs == nil {
		shared.runs, shared.attached = map[string]uint64{}, map[string]string{}
	}
	if st, err := shared.tr.Stats(); err == nil {
		for n, p := range st.Programs {
			shared.runs[n] += p.RunCount
		}
	}
	for _, h := range shared.tr.Hooks() {
		if h.Active {
			shared.attached[h.Program] = h.Hook
		}
	}
	shared.tr.Close()
	shared.tr = nil
	return true
}

// unloadShared is closeShared for a test about to load its own kernel
// side; it notes when that cost a test of the shared pass a load.
func unloadShared(t *testing.T) {
	t.Helper()
	if closeShared() && shared.sharedPass {
		t.Logf("unloaded the shared load, which the next test loads again: list %s in firstPassTests", t.Name())
	}
}

// loadShared loads the tracer with startTracer's configuration and checks.
func loadShared() (*tracer.Tracer, error) {
	tr, err := tracer.New(tracertest.Config(nil))
	if err != nil {
		return nil, fmt.Errorf("load tracer: %w", err)
	}
	if err := tracertest.Check(tr); err != nil {
		tr.Close()
		return nil, err
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
	code := runFirstPassFirst(m)
	closeShared()
	defer shared.stats.Close()
	if shared.attached == nil {
		return code // no test shared the load
	}
	fmt.Println("=== RUN   TestEveryAttachedProgramRan")
	var names, idle []string
	for n := range shared.attached {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("    shared_priv_test.go:1: %s (%s): %d runs\n", n, shared.attached[n], shared.runs[n])
		if shared.runs[n] == 0 {
			idle = append(idle, n)
		}
	}
	if len(idle) > 0 {
		fmt.Println("--- FAIL: TestEveryAttachedProgramRan (0.00s)")
		fmt.Printf("    shared_priv_test.go:1: attached but never ran in these tests: %v\n", idle)
		return 1
	}
	fmt.Println("--- PASS: TestEveryAttachedProgramRan (0.00s)")
	return code
}

// firstPassTests run first under the shared load, in a pass of their own
// (runFirstPassFirst): tests that load their own kernel side (startTracer,
// pinning), which unloads the shared one so that the next test that
// shares it loads it again (30 s under TCG), and the test with sockets
// opened before the start, which makes the shared load itself
// (startSharedTracerAfter). The pass runs them in file order:
// pin_priv_test.go's before tracer_priv_test.go's, so the shared load the
// last one makes is kept for the second pass. A test that loads its own
// and is missing here still passes; unloadShared logs that it cost a load.
var firstPassTests = []string{
	"TestPersistentTCPIncludingOneOpenedBeforeStart",
	"TestPinnedKernelSideSurvivesItsProcess",
}

// runFirstPassFirst runs the tests -test.run selects in two passes: those
// of firstPassTests, then the others (-test.skip leaves out the first
// pass's). testing.M.Run reads -test.run and -test.skip afresh on each
// call; -test.timeout holds per pass. One pass, as go test would run them,
// when the pattern names subtests (a slash), or for a listing, benchmarks
// or profiles (each pass would list, run or write them again).
func runFirstPassFirst(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse() // as m.Run would: the patterns must be read first
	}
	runFlag, skipFlag := flag.Lookup("test.run"), flag.Lookup("test.skip")
	run, skip := runFlag.Value.String(), skipFlag.Value.String()
	onePass := strings.Contains(run, "/") || strings.Contains(skip, "/")
	for _, f := range []string{"test.list", "test.bench", "test.cpuprofile", "test.memprofile", "test.coverprofile", "test.trace"} {
		if fl := flag.Lookup(f); fl != nil && fl.Value.String() != "" {
			onePass = true
		}
	}
	runRE, err := regexp.Compile(run)
	if err != nil || onePass {
		shared.sharedPass = true
		return m.Run()
	}
	var first []string
	for _, name := range firstPassTests {
		if runRE.MatchString(name) {
			first = append(first, regexp.QuoteMeta(name))
		}
	}
	if len(first) == 0 {
		shared.sharedPass = true
		return m.Run()
	}
	// String flags: Set cannot fail.
	own := "^(" + strings.Join(first, "|") + ")$"
	_ = runFlag.Value.Set(own)
	code := m.Run()
	if skip != "" {
		own = "(" + skip + ")|" + own
	}
	_ = runFlag.Value.Set(run)
	_ = skipFlag.Value.Set(own)
	shared.sharedPass = true
	if c := m.Run(); c != 0 {
		code = c
	}
	return code
}

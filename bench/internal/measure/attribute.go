package measure

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The whole-machine attribution: perf samples every CPU at a fixed
// frequency during each run of a pair, and the samples of the symbols
// deptrace adds (its programs, the kernel's dispatch to them, the helpers
// they call, the agent process) are counted in the traced run less the
// untraced one. /proc/stat's busy time cannot resolve a microsecond per
// round trip on a shared VM (the load generator's own variance is larger);
// these symbols are absent or nearly so without deptrace, so their counts
// hold deptrace's cost, including what bpf_stats leaves out (the dispatch
// around each run, the cgroup hooks' own work, the agent). It is a floor:
// a sample counts for the function it lands in, so generic kernel code run
// on deptrace's behalf (bucket locks, memcpy, user copies) is not counted.

// perfFreq is the sampling frequency per CPU: a prime, off the timer tick.
const perfFreq = 4999

// SampleCounts is one run's samples: per category (see sampleCategory),
// and those of the agent process (deptrace's user-space side).
type SampleCounts struct {
	ByCategory map[string]int
	Agent      int
	// All is every sample of the run, perf's own included; Idle those
	// of the idle task (pid 0). cpu-clock samples idle CPUs too, so
	// (All-Idle)/All is the machine's busy share, to check against
	// /proc/stat (checkBusyAgrees).
	All, Idle int
	// Lost is what perf reports it lost (LOST and LOST_SAMPLES records):
	// any makes the counts short, and the run fails its check.
	Lost int
}

// perfRun samples the whole machine until stop.
type perfRun struct {
	cmd  *exec.Cmd
	file string
	errb bytes.Buffer
}

// checkPerf says, in one line, why the attribution cannot run here.
func checkPerf() error {
	if _, err := exec.LookPath("perf"); err != nil {
		return errors.New("--attribute needs perf (Debian package linux-perf): not found in PATH")
	}
	return nil
}

// startPerf samples every CPU until stop, or for at most limit: a bench
// killed without stopping it leaves no perf recording the machine. The
// event is cpu-clock, so that every sample is the same time of CPU (a
// hardware cycles event would vary its period), and times are on
// CLOCK_MONOTONIC, so that the samples can be cut to the load's run.
func startPerf(dir string, limit time.Duration) (*perfRun, error) {
	p := &perfRun{file: filepath.Join(dir, "run.data")} // removed by stop
	p.cmd = exec.Command("perf", "record", "-a", "-e", "cpu-clock", "-F", strconv.Itoa(perfFreq), "-k", "CLOCK_MONOTONIC",
		"-o", p.file, "--", "sleep", strconv.Itoa(int(limit.Seconds())+1))
	p.cmd.Stderr = &p.errb
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start perf record: %w", err)
	}
	time.Sleep(500 * time.Millisecond) // perf has opened its events before the load starts
	return p, nil
}

// monotonicNow is CLOCK_MONOTONIC, the clock of perf's sample times.
func monotonicNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // CLOCK_MONOTONIC is always there
	return time.Duration(ts.Nano())
}

// stop ends the recording; with count, it counts the samples taken from
// start to end (CLOCK_MONOTONIC); agentPID is the process whose samples
// are the agent's.
func (p *perfRun) stop(count bool, agentPID int, start, end time.Duration) (SampleCounts, error) {
	defer func() { _ = os.Remove(p.file) }() // a scratch file; a leftover in the temp dir is harmless
	p.cmd.Process.Signal(syscall.SIGINT)
	// perf writes its file and then dies of the SIGINT it was sent.
	if err := p.cmd.Wait(); err != nil && !stoppedBySIGINT(p.cmd) {
		return SampleCounts{}, fmt.Errorf("perf record: %v: %s", err, lastLine(p.errb.String()))
	}
	if !count {
		return SampleCounts{}, nil
	}
	var errb bytes.Buffer
	script := exec.Command("perf", "script", "-i", p.file, "-F", "pid,time,ip,sym")
	script.Stderr = &errb
	out, err := script.Output()
	if err != nil {
		return SampleCounts{}, fmt.Errorf("perf script: %v: %s", err, lastLine(errb.String()))
	}
	c, err := countSamples(bytes.NewReader(out), sampleFilter{agentPID: agentPID, perfPID: p.cmd.Process.Pid, start: start, end: end})
	if err != nil {
		return c, err
	}
	errb.Reset()
	stats := exec.Command("perf", "report", "-i", p.file, "--stats")
	stats.Stderr = &errb
	if out, err = stats.Output(); err != nil {
		return c, fmt.Errorf("perf report --stats: %v: %s", err, lastLine(errb.String()))
	}
	c.Lost = countLost(string(out))
	return c, nil
}

// countLost adds up the LOST and LOST_SAMPLES records of `perf report
// --stats` ("LOST events: 3"); perf prints none when it lost nothing.
func countLost(stats string) int {
	n := 0
	for _, line := range strings.Split(stats, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), " events:")
		if !ok || (name != "LOST" && name != "LOST_SAMPLES") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) > 0 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				n += v
			}
		}
	}
	return n
}

// stoppedBySIGINT says whether perf ended as a SIGINT ends it: it stops
// its command (sleep) with SIGTERM and ends as that command did.
func stoppedBySIGINT(cmd *exec.Cmd) bool {
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return false
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		if (ws.Signaled() && ws.Signal() == sig) || ws.ExitStatus() == 128+int(sig) {
			return true
		}
	}
	return false
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// sampleFilter says which samples count, and whose are the agent's.
type sampleFilter struct {
	agentPID, perfPID int
	start, end        time.Duration // CLOCK_MONOTONIC
}

// countSamples reads `perf script -F pid,time,ip,sym` lines
// ("pid seconds.micros: ip symbol").
func countSamples(r io.Reader, flt sampleFilter) (SampleCounts, error) {
	c := SampleCounts{ByCategory: map[string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		secs, err2 := strconv.ParseFloat(strings.TrimSuffix(f[1], ":"), 64)
		if err != nil || err2 != nil {
			return c, fmt.Errorf("perf script: unexpected line %q", sc.Text())
		}
		if at := time.Duration(secs * 1e9); at < flt.start || at > flt.end {
			continue
		}
		c.All++
		if pid == 0 {
			c.Idle++
		}
		if pid == flt.perfPID {
			continue
		}
		if pid == flt.agentPID {
			c.Agent++
			continue
		}
		sym := ""
		if len(f) >= 4 {
			sym = f[3]
		}
		if cat := sampleCategory(sym); cat != "" {
			c.ByCategory[cat]++
		}
	}
	return c, sc.Err()
}

var (
	// bpf_prog_<tag>[_<name>]: a JIT-compiled program, named by its
	// function where it has one.
	progSym = regexp.MustCompile(`^bpf_prog_[0-9a-f]{16}(?:_(\w+))?$`)
	// The kernel's call of tracing programs: from a tracepoint, or
	// through a trampoline (fexit, where the kernel has it).
	dispatchSym = regexp.MustCompile(`^(bpf_trace_run\d+|__traceiter_\w+|__bpf_trace_\w+|call_trace_\w+|bpf_trampoline_\w+|__bpf_prog_enter\w*|__bpf_prog_exit\w*|__bpf_tramp_\w+)$`)
	// The kernel's run of cgroup programs, with its buffers for socket
	// options and, for cgroup_skb programs (the DNS watcher's), the save
	// and restore of the packet's control block around each run.
	cgroupSym = regexp.MustCompile(`^(__cgroup_bpf_run_filter_\w+|sockopt_alloc_buf|sockopt_free_buf|bpf_prog_run_array_cg|__bpf_prog_run_save_cb)$`)
	// Helpers and map operations the programs call (kernel functions
	// that, on a machine without other BPF users, only programs call).
	helperSym = regexp.MustCompile(`^(bpf_\w+|__bpf_\w+|htab_\w+|__htab_\w+|lookup_nulls_elem_raw|ktime_get_mono_fast_ns|__sock_gen_cookie|copy_from_kernel_nofault\w*|bpf_local_storage\w*|bpf_sk_storage\w*)$`)
)

// sampleCategory names what a kernel symbol is to deptrace, or "" for the
// rest of the machine.
func sampleCategory(sym string) string {
	if m := progSym.FindStringSubmatch(sym); m != nil {
		if m[1] == "" {
			return "program (unnamed)"
		}
		return "program " + m[1]
	}
	switch {
	case strings.HasPrefix(sym, "bpf_lsm_"):
		return "" // the LSM hooks' empty stubs run with or without BPF
	case dispatchSym.MatchString(sym):
		return "tracepoint dispatch"
	case cgroupSym.MatchString(sym):
		return "cgroup hook dispatch"
	case helperSym.MatchString(sym):
		return "helpers and maps"
	}
	return ""
}

// Attribution is deptrace's cost per round trip by category, from the
// pairs of one load.
type Attribution struct {
	Pairs int
	// PerPair is, per category, the traced run's samples less the
	// untraced run's, in ns of CPU per round trip, one value per pair.
	PerPair map[string][]float64
}

const agentCategory = "agent process (user space and its system calls)"

// addPair adds one pair's difference.
func (a *Attribution) addPair(base, traced SampleCounts, baseRT, tracedRT int64) {
	ns := func(n int, rt int64) float64 { return float64(n) * 1e9 / perfFreq / float64(max(rt, 1)) }
	diff := map[string]float64{agentCategory: ns(traced.Agent, tracedRT) - ns(base.Agent, baseRT)}
	for k, n := range traced.ByCategory {
		diff[k] += ns(n, tracedRT)
	}
	for k, n := range base.ByCategory {
		diff[k] -= ns(n, baseRT)
	}
	if a.PerPair == nil {
		a.PerPair = map[string][]float64{}
	}
	for k := range diff {
		if _, ok := a.PerPair[k]; !ok {
			a.PerPair[k] = make([]float64, a.Pairs) // absent from earlier pairs: 0 there
		}
	}
	for k := range a.PerPair {
		a.PerPair[k] = append(a.PerPair[k], diff[k])
	}
	a.Pairs++
}

// Total is, per pair, the sum of every category.
func (a Attribution) Total() []float64 {
	t := make([]float64, a.Pairs)
	for _, v := range a.PerPair {
		for i, x := range v {
			t[i] += x
		}
	}
	return t
}

// WriteAttributionMarkdown renders the attribution of every load; cfg
// says what the traced runs ran.
func WriteAttributionMarkdown(w io.Writer, rs []PairedResult, cfg PairedConfig) {
	fmt.Fprintf(w, "Where the extra CPU goes: perf samples of the whole machine at %d Hz per CPU during each run; per category, the traced run's samples less the untraced run's, as ns of CPU per round trip (median over pairs, and the lowest and highest pair). Symbols outside these categories (the load generator, the TCP stack) are left out: their run-to-run variance is larger than deptrace's cost.\n", perfFreq)
	for _, r := range rs {
		if r.Attribution.PerPair == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s, %.0f/s:\n\n", r.Load.Name, r.Load.Rate)
		fmt.Fprintln(w, "| category | ns per round trip, median | lowest to highest pair |")
		fmt.Fprintln(w, "|---|---|---|")
		cats := make([]string, 0, len(r.Attribution.PerPair))
		for k := range r.Attribution.PerPair {
			cats = append(cats, k)
		}
		med := func(k string) float64 { return quantile(r.Attribution.PerPair[k], 0.5) }
		slices.SortFunc(cats, func(x, y string) int { return cmp.Or(cmp.Compare(med(y), med(x)), strings.Compare(x, y)) })
		for _, k := range cats {
			v := r.Attribution.PerPair[k]
			if m := med(k); m < 5 && m > -5 {
				continue // below a sample's weight at these rates
			}
			fmt.Fprintf(w, "| %s | %.0f | %.0f to %.0f |\n", k, med(k), slices.Min(v), slices.Max(v))
		}
		t := r.Attribution.Total()
		fmt.Fprintf(w, "| **all of %s** | **%.0f** | %.0f to %.0f |\n", cfg.tracedSide(), quantile(t, 0.5), slices.Min(t), slices.Max(t))
	}
}

// attributeRun runs fn, which lasts about phase, with perf sampling the
// machine, and counts the samples taken while fn ran.
func attributeRun(dir string, phase time.Duration, fn func() error) (SampleCounts, error) {
	p, err := startPerf(dir, phase+time.Minute)
	if err != nil {
		return SampleCounts{}, err
	}
	start := monotonicNow()
	err = fn()
	end := monotonicNow()
	c, perr := p.stop(err == nil, os.Getpid(), start, end)
	if err == nil {
		err = perr
	}
	return c, err
}

package bench

import (
	"bufio"
	"bytes"
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
)

// The whole-machine attribution: perf samples every CPU at a fixed
// frequency during each run of a pair, and the samples of the symbols
// deptrace adds (its programs, the kernel's dispatch to them, the helpers
// they call, the agent process) are counted in the traced run less the
// untraced one. /proc/stat's busy time cannot resolve a microsecond per
// round trip on a shared VM (the load generator's own variance is larger);
// these symbols are absent or nearly so without deptrace, so their counts
// hold only deptrace's cost, including what bpf_stats leaves out (the
// dispatch around each run, cache misses it causes there, the cgroup hooks'
// own work, the agent).

// perfFreq is the sampling frequency per CPU: a prime, off the timer tick.
const perfFreq = 4999

// SampleCounts is one run's samples: per category (see sampleCategory),
// and those of the agent process (deptrace's user-space side).
type SampleCounts struct {
	ByCategory map[string]int
	Agent      int
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

func startPerf(dir string, n int) (*perfRun, error) {
	p := &perfRun{file: filepath.Join(dir, fmt.Sprintf("run%d.data", n))}
	p.cmd = exec.Command("perf", "record", "-a", "-F", strconv.Itoa(perfFreq), "-o", p.file)
	p.cmd.Stderr = &p.errb
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start perf record: %w", err)
	}
	time.Sleep(500 * time.Millisecond) // perf has opened its events before the load starts
	return p, nil
}

// stop ends the recording and counts its samples; agentPID is the
// process whose samples are the agent's.
func (p *perfRun) stop(agentPID int) (SampleCounts, error) {
	p.cmd.Process.Signal(syscall.SIGINT)
	// perf writes its file and then dies of the SIGINT it was sent.
	if err := p.cmd.Wait(); err != nil && !stoppedBySIGINT(p.cmd) {
		return SampleCounts{}, fmt.Errorf("perf record: %v: %s", err, lastLine(p.errb.String()))
	}
	defer os.Remove(p.file)
	out, err := exec.Command("perf", "script", "-i", p.file, "-F", "pid,ip,sym").Output()
	if err != nil {
		return SampleCounts{}, fmt.Errorf("perf script: %w", err)
	}
	return countSamples(bytes.NewReader(out), agentPID)
}

func stoppedBySIGINT(cmd *exec.Cmd) bool {
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ((ws.Signaled() && ws.Signal() == syscall.SIGINT) || ws.ExitStatus() == 128+int(syscall.SIGINT))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// countSamples reads `perf script -F pid,ip,sym` lines ("pid ip symbol").
func countSamples(r io.Reader, agentPID int) (SampleCounts, error) {
	c := SampleCounts{ByCategory: map[string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			return c, fmt.Errorf("perf script: unexpected line %q", sc.Text())
		}
		if pid == agentPID {
			c.Agent++
			continue
		}
		sym := ""
		if len(f) >= 3 {
			sym = f[2]
		}
		if cat := sampleCategory(sym); cat != "" {
			c.ByCategory[cat]++
		}
	}
	return c, sc.Err()
}

var (
	// bpf_prog_<tag>_<name>: a JIT-compiled program, named by its function.
	progSym = regexp.MustCompile(`^bpf_prog_[0-9a-f]{16}_(\w+)$`)
	// The kernel's call of tracing programs from a tracepoint.
	dispatchSym = regexp.MustCompile(`^(bpf_trace_run\d+|__traceiter_\w+|__bpf_trace_\w+|call_trace_\w+)$`)
	// The kernel's run of cgroup programs, with its buffers for socket options.
	cgroupSym = regexp.MustCompile(`^(__cgroup_bpf_run_filter_\w+|sockopt_alloc_buf|sockopt_free_buf|bpf_prog_run_array_cg)$`)
	// Helpers and map operations the programs call (kernel functions
	// that, on a machine without other BPF users, only programs call).
	helperSym = regexp.MustCompile(`^(bpf_\w+|__bpf_\w+|htab_\w+|__htab_\w+|lookup_nulls_elem_raw|ktime_get_mono_fast_ns|__sock_gen_cookie|copy_from_kernel_nofault\w*|bpf_local_storage\w*|bpf_sk_storage\w*)$`)
)

// sampleCategory names what a kernel symbol is to deptrace, or "" for the
// rest of the machine.
func sampleCategory(sym string) string {
	if m := progSym.FindStringSubmatch(sym); m != nil {
		return "program " + m[1]
	}
	switch {
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

// WriteAttributionMarkdown renders the attribution of every load.
func WriteAttributionMarkdown(w io.Writer, rs []PairedResult) {
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
		slices.SortFunc(cats, func(x, y string) int {
			if d := med(y) - med(x); d != 0 {
				if d > 0 {
					return 1
				}
				return -1
			}
			return strings.Compare(x, y)
		})
		for _, k := range cats {
			v := r.Attribution.PerPair[k]
			if m := med(k); m < 5 && m > -5 {
				continue // below a sample's weight at these rates
			}
			fmt.Fprintf(w, "| %s | %.0f | %.0f to %.0f |\n", k, med(k), slices.Min(v), slices.Max(v))
		}
		t := r.Attribution.Total()
		fmt.Fprintf(w, "| **all of deptrace** | **%.0f** | %.0f to %.0f |\n", quantile(t, 0.5), slices.Min(t), slices.Max(t))
	}
}

// attributeRun runs fn with perf sampling the machine around it.
func attributeRun(dir string, n int, fn func() (int64, error)) (SampleCounts, int64, error) {
	p, err := startPerf(dir, n)
	if err != nil {
		return SampleCounts{}, 0, err
	}
	rt, err := fn()
	c, perr := p.stop(os.Getpid())
	if err == nil {
		err = perr
	}
	return c, rt, err
}

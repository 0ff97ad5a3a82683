package measure

import (
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/loadgen"
	"github.com/deptrace/deptrace/tracer"
)

// CompareConfig is one sweep of deptrace bench compare.
type CompareConfig struct {
	Workloads   []string
	Rates       []float64 // target round trips (tcp-short: connections) per second
	Methods     []string
	Duration    time.Duration // of each run
	Interval    time.Duration // how often each method hands over its flows
	Concurrency int           // clients for tcp-short and udp
	Persistent  int           // connections held open for tcp-persistent
	MsgSize     int
	// The many-peers sweep: Peers emulated client hosts each, at PeersRate.
	Peers         []int
	PeersRate     float64
	PeersWorkload string
	// KernelStats adds a run per point with bpf_stats on, for kernel time.
	KernelStats bool
	// LoadCommand starts `deptrace bench load`; flags are appended.
	LoadCommand []string
	// MinReached is the fraction of the asked rate every run must reach
	// (0: none); Attempts is how often a run that falls short is made
	// before the sweep fails. Tolerance is how far a row's figures may
	// disagree with each other (CheckRow).
	MinReached float64
	Attempts   int
	Tolerance  float64
	// Realtime runs the load under SCHED_FIFO (loadgen.Realtime).
	Realtime bool
}

// Defaults of the harness's own checks.
const (
	DefaultMinReached = 0.95
	DefaultAttempts   = 3
	DefaultTolerance  = 0.10
)

// Row is one measured point.
type Row struct {
	Sweep         string        `json:"sweep"` // "rate" or "peers"
	Workload      string        `json:"workload"`
	TargetRate    float64       `json:"target_rate"`
	Peers         int           `json:"peers"`
	Method        string        `json:"method"`
	Rate          float64       `json:"rate"`
	Reached       bool          `json:"reached"`
	P50           time.Duration `json:"p50_ns"`
	P99           time.Duration `json:"p99_ns"`
	BaselineRate  float64       `json:"baseline_rate"`
	BaselineP50   time.Duration `json:"baseline_p50_ns"`
	BaselineP99   time.Duration `json:"baseline_p99_ns"`
	TracerCPU     float64       `json:"tracer_cpu_pct"`   // user+system of the tracer process, % of one core
	KernelCPU     float64       `json:"kernel_cpu_pct"`   // kernel programs, % of one core (bpf_stats run)
	KernelNsPerRT float64       `json:"kernel_ns_per_rt"` // summed program time per round trip
	KernelRate    float64       `json:"kernel_rate"`      // achieved rate of the bpf_stats run
	// KernelRunsPerRT is the method's program runs per round trip, and
	// FloorNs what bpf_stats itself adds to each run (its two clock reads
	// and the call, measured on an empty program in the same run:
	// floorProbe): the net figures take runs × floor away. 0: not
	// measured (results of an older sweep).
	KernelRunsPerRT float64 `json:"kernel_runs_per_rt"`
	FloorNs         float64 `json:"floor_ns_per_run"`
	TrueEdges       int     `json:"true_edges"`
	FoundEdges      int     `json:"found_edges"`
	Recall          float64 `json:"recall"`
	Records         int     `json:"records"` // flow records handed to user space
	Losses          uint64  `json:"losses"`
	// Retries counts the runs of this row made again because they fell
	// short of the rate (CompareConfig.Attempts).
	Retries int `json:"retries"`
}

// TotalCPU is tracer process plus kernel programs.
func (r Row) TotalCPU() float64 { return r.TracerCPU + r.KernelCPU }

// NetMeasured says whether the row has the floor of bpf_stats to take
// away (an eBPF method measured by a sweep that measures the floor).
func (r Row) NetMeasured() bool { return r.FloorNs > 0 && r.KernelRunsPerRT > 0 }

// NetKernelNsPerRT is the kernel programs' time per round trip less
// bpf_stats' own clock reads: what the programs cost with bpf_stats off,
// as in production. It still leaves out the kernel's dispatch to them,
// which grows with the runs too (docs/performance.md measures it).
func (r Row) NetKernelNsPerRT() float64 {
	if !r.NetMeasured() {
		return r.KernelNsPerRT
	}
	return max(r.KernelNsPerRT-r.KernelRunsPerRT*r.FloorNs, 0)
}

// NetKernelCPU is KernelCPU less bpf_stats' clock reads, in the same
// proportion as NetKernelNsPerRT.
func (r Row) NetKernelCPU() float64 {
	if !r.NetMeasured() || r.KernelNsPerRT <= 0 {
		return r.KernelCPU
	}
	return r.KernelCPU * r.NetKernelNsPerRT() / r.KernelNsPerRT
}

// NetTotalCPU is tracer process plus kernel programs net of the floor.
func (r Row) NetTotalCPU() float64 { return r.TracerCPU + r.NetKernelCPU() }

// point is one load configuration of a sweep.
type point struct {
	sweep    string
	workload string
	rate     float64
	peers    int
}

func (c CompareConfig) points() []point {
	var ps []point
	for _, w := range c.Workloads {
		for _, r := range c.Rates {
			ps = append(ps, point{sweep: "rate", workload: w, rate: r})
		}
	}
	for _, p := range c.Peers {
		ps = append(ps, point{sweep: "peers", workload: c.PeersWorkload, rate: c.PeersRate, peers: p})
	}
	return ps
}

func (c CompareConfig) loadArgs(p point) []string {
	conc := c.Concurrency
	if p.workload == loadgen.TCPPersistent {
		conc = c.Persistent
	}
	args := append([]string{}, c.LoadCommand[1:]...)
	if c.Realtime {
		args = append(args, "--realtime")
	}
	return append(args, "--workload", p.workload, "--rate", strconv.FormatFloat(p.rate, 'f', -1, 64),
		"--concurrency", strconv.Itoa(conc), "--msg-size", strconv.Itoa(c.MsgSize), "--duration", c.Duration.String(),
		"--clients", strconv.Itoa(p.peers), "--serve", "127.0.0.1:0", "--output", "json")
}

// Compare runs the sweep, printing progress to progress and each finished
// row to onRow (so partial results survive an interrupted sweep).
func Compare(ctx context.Context, c CompareConfig, progress io.Writer, onRow func(Row)) ([]Row, error) {
	points := c.points()
	runsPerPoint := 1 + len(c.Methods)
	if c.KernelStats {
		for _, m := range c.Methods {
			if m != Polling {
				runsPerPoint++
			}
		}
	}
	total, done := len(points)*runsPerPoint, 0
	start := time.Now()
	step := func(format string, a ...any) {
		done++
		eta := "?"
		if done > 1 {
			eta = (time.Since(start) / time.Duration(done-1) * time.Duration(total-done+1)).Round(time.Second).String()
		}
		fmt.Fprintf(progress, "bench: [%d/%d, about %s left] %s\n", done, total, eta, fmt.Sprintf(format, a...))
	}
	var rows []Row
	for _, p := range points {
		label := fmt.Sprintf("%s rate=%.0f", p.workload, p.rate)
		if p.sweep == "peers" {
			label += fmt.Sprintf(" peers=%d", p.peers)
		}
		step("%s: baseline without tracing (%s)", label, c.Duration)
		base, _, err := c.reaching(progress, label+": baseline", p.rate, func() (loadgen.Result, error) {
			return runLoadArgs(ctx, c.LoadCommand[0], c.loadArgs(p))
		})
		if err != nil {
			return rows, err
		}
		for _, name := range c.Methods {
			step("%s: %s, tracer CPU and recall", label, name)
			var row Row
			_, retries, err := c.reaching(progress, label+": "+name, p.rate, func() (loadgen.Result, error) {
				r, res, err := c.measure(ctx, p, name, base)
				row = r
				return res, err
			})
			if err != nil {
				return rows, fmt.Errorf("%s %s: %w", label, name, err)
			}
			row.Retries = retries
			if c.KernelStats && name != Polling {
				step("%s: %s, kernel program time (bpf_stats on)", label, name)
				_, retries, err = c.reaching(progress, label+": "+name+" with bpf_stats", p.rate, func() (loadgen.Result, error) {
					return c.kernelTime(ctx, p, name, &row)
				})
				if err != nil {
					return rows, fmt.Errorf("%s %s: %w", label, name, err)
				}
				row.Retries += retries
			}
			if err := CheckRow(row, cmp.Or(c.Tolerance, DefaultTolerance)); err != nil {
				return rows, fmt.Errorf("%s %s: %w", label, name, err)
			}
			rows = append(rows, row)
			if onRow != nil {
				onRow(row)
			}
		}
	}
	return rows, nil
}

// measure runs the load with one method attached and collecting every
// Interval: the process's CPU during the run is the tracer's.
func (c CompareConfig) measure(ctx context.Context, p point, name string, base loadgen.Result) (Row, loadgen.Result, error) {
	m, err := NewMethod(name)
	if err != nil {
		return Row{}, loadgen.Result{}, err
	}
	defer func() { _ = m.Close() }() // the measurement is taken; nothing to report
	_, _ = m.Collect()               // start from an empty slate

	var (
		mu      sync.Mutex
		flows   []tracer.Flow
		records int
		collErr error
	)
	collect := func() {
		fs, err := m.Collect()
		mu.Lock()
		defer mu.Unlock()
		if err != nil && collErr == nil {
			collErr = err
		}
		records += len(fs)
		flows = append(flows, fs...)
	}
	cpu0 := processCPU()
	stop := every(c.Interval, collect)
	res, err := runLoadArgs(ctx, c.LoadCommand[0], c.loadArgs(p))
	stop()
	collect() // the last partial interval
	cpu := processCPU() - cpu0
	if err != nil {
		return Row{}, res, err
	}
	if collErr != nil {
		return Row{}, res, collErr
	}
	found, total := Recall(res.Edges, flows)
	return Row{
		Sweep: p.sweep, Workload: p.workload, TargetRate: p.rate, Peers: p.peers, Method: name,
		Rate: res.Rate, Reached: res.Reached, P50: res.P50, P99: res.P99,
		BaselineRate: base.Rate, BaselineP50: base.P50, BaselineP99: base.P99,
		TracerCPU: cpu.Seconds() / res.Elapsed.Seconds() * 100,
		TrueEdges: total, FoundEdges: found, Recall: ratio(found, total),
		Records: records, Losses: m.Losses(),
	}, res, nil
}

// kernelTime reruns the load with bpf_stats on and fills the kernel
// columns, all from this one run.
func (c CompareConfig) kernelTime(ctx context.Context, p point, name string, row *Row) (loadgen.Result, error) {
	m, err := NewMethod(name)
	if err != nil {
		return loadgen.Result{}, err
	}
	defer func() { _ = m.Close() }() // the measurement is taken; nothing to report
	// An empty program on a tracepoint every load's round trips fire,
	// measured the same way: bpf_stats' own cost per run, the floor.
	floor, err := attachFloorProbe()
	if err != nil {
		return loadgen.Result{}, err
	}
	defer floor.Close()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return loadgen.Result{}, fmt.Errorf("enable bpf_stats: %w", err)
	}
	defer func() { _ = stats.Close() }()                     // turning bpf_stats off: nothing to report
	stop := every(c.Interval, func() { _, _ = m.Collect() }) // keep draining as in real use
	r0, t0, err := m.KernelTime()
	if err != nil {
		stop()
		return loadgen.Result{}, err
	}
	if err := floor.start(); err != nil {
		stop()
		return loadgen.Result{}, err
	}
	res, err := runLoadArgs(ctx, c.LoadCommand[0], c.loadArgs(p))
	r1, t1, err2 := m.KernelTime()
	floorNs, err3 := floor.nsPerRun()
	stop()
	if err != nil {
		return res, err
	}
	if err2 != nil {
		return res, err2
	}
	if err3 != nil {
		return res, err3
	}
	kt := t1 - t0
	row.KernelCPU = kt.Seconds() / res.Elapsed.Seconds() * 100
	row.KernelRate = res.Rate
	row.KernelNsPerRT, row.KernelRunsPerRT, row.FloorNs = 0, 0, floorNs
	if res.RoundTrips > 0 {
		row.KernelNsPerRT = float64(kt.Nanoseconds()) / float64(res.RoundTrips)
		row.KernelRunsPerRT = float64(r1-r0) / float64(res.RoundTrips)
	}
	return res, nil
}

// reaching makes a run (fn) until it reaches c.MinReached of the asked
// rate, at most c.Attempts times, and says how many runs fell short.
// A run that still falls short is an error naming what it reached and
// what the load saw.
func (c CompareConfig) reaching(progress io.Writer, what string, target float64, fn func() (loadgen.Result, error)) (loadgen.Result, int, error) {
	attempts := max(c.Attempts, 1)
	for i := 1; ; i++ {
		res, err := fn()
		if err != nil {
			return res, i - 1, err
		}
		short := CheckReached(what, res, target, c.MinReached)
		if short == nil {
			return res, i - 1, nil
		}
		if i >= attempts {
			return res, i - 1, fmt.Errorf("%w (%d runs)", short, i)
		}
		fmt.Fprintf(progress, "bench: %v; running it again (%d of %d)\n", short, i+1, attempts)
	}
}

// CheckReached says, in one line, how a run fell below min (a fraction)
// of its target rate, with what the load saw; nil when it did not.
func CheckReached(what string, res loadgen.Result, target, min float64) error {
	if target <= 0 || min <= 0 || res.Rate >= min*target {
		return nil
	}
	detail := fmt.Sprintf("%d starts missed, %d clients, latency mean %s, max %s, %d errors",
		res.Missed, res.Clients, res.Mean.Round(time.Microsecond), res.Max.Round(time.Microsecond), res.Errors)
	if res.FirstError != "" {
		detail += " (first: " + res.FirstError + ")"
	}
	return fmt.Errorf("%s reached %.0f/s of the %.0f/s asked (%.1f %%, below %.0f %%): %s",
		what, res.Rate, target, res.Rate/target*100, min*100, detail)
}

// CheckRow says, in one line, which of a row's figures disagree with
// each other by more than tol (a fraction): the kernel programs' CPU
// must be their ns per round trip times the rate, both the rate of the
// run with bpf_stats and the row's achieved rate (the table shows the
// latter beside the kernel figures of the former), and the floor of
// bpf_stats taken away for the net figures must have been measured and
// be smaller than the programs' own average run. The total is the sum of
// its parts by construction (Row.TotalCPU).
func CheckRow(r Row, tol float64) error {
	off := func(got, want float64) float64 {
		if got == want {
			return 0
		}
		return math.Abs(got-want) / math.Max(math.Abs(got), math.Abs(want))
	}
	if r.Method == Polling || (r.KernelCPU == 0 && r.KernelNsPerRT == 0) {
		return nil
	}
	for _, rate := range []struct {
		name string
		v    float64
	}{{"the bpf_stats run's", r.KernelRate}, {"the achieved", r.Rate}} {
		want := r.KernelNsPerRT * rate.v / 1e7 // ns per round trip × round trips per second, % of one core
		if d := off(r.KernelCPU, want); d > tol {
			return fmt.Errorf("kernel programs CPU %.3f %% disagrees with %.0f ns per round trip × %s rate %.0f/s = %.3f %% (%.0f %% off, tolerance %.0f %%)",
				r.KernelCPU, r.KernelNsPerRT, rate.name, rate.v, want, d*100, tol*100)
		}
	}
	if r.KernelRunsPerRT == 0 && r.FloorNs == 0 {
		return nil // an older sweep's row: no net figures
	}
	if !r.NetMeasured() {
		return fmt.Errorf("bpf_stats' floor was not measured (%.1f program runs per round trip, floor %.1f ns per run): no net figures", r.KernelRunsPerRT, r.FloorNs)
	}
	if avg := r.KernelNsPerRT / r.KernelRunsPerRT; r.FloorNs >= avg {
		return fmt.Errorf("bpf_stats' floor, %.1f ns per run on an empty program, is not below the method's own %.1f ns per run: the floor run was disturbed", r.FloorNs, avg)
	}
	return nil
}

// every calls fn each interval until the returned stop is called; stop
// returns once fn is no longer running.
func every(interval time.Duration, fn func()) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				fn()
			}
		}
	}()
	return func() { close(done); <-stopped }
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// processCPU is this process's user+system CPU so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type edgeID struct {
	client, server string
	port           uint16
	proto          string
}

// Recall counts how many true edges the flows report. A flow reports the
// edge of its client and server whichever end it was seen from; a true
// edge whose client address the kernel chose (Client "") matches any
// client.
func Recall(truth []loadgen.Edge, flows []tracer.Flow) (found, total int) {
	reported := map[edgeID]bool{}
	anyClient := map[edgeID]bool{}
	for _, f := range flows {
		srv := f.ServerAddr()
		id := edgeID{f.ClientAddr(), srv.Addr().String(), srv.Port(), string(f.Proto)}
		reported[id] = true
		id.client = ""
		anyClient[id] = true
	}
	for _, e := range truth {
		id := edgeID{e.Client, e.Server, e.Port, e.Proto}
		if (e.Client == "" && anyClient[id]) || reported[id] {
			found++
		}
	}
	return found, len(truth)
}

// runLoadArgs runs the load generator as its own process and parses its
// JSON result.
func runLoadArgs(ctx context.Context, bin string, args []string) (loadgen.Result, error) {
	return runLoadProcess(ctx, bin, args)
}

// WriteResults writes rows as results.json and results.csv in dir.
func WriteResults(dir string, rows []Row) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), js, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "results.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(CSVHeader) // a csv.Writer keeps its first error for Error
	for _, r := range rows {
		_ = w.Write(r.csv())
	}
	w.Flush()
	if err := w.Error(); err != nil {
		_ = f.Close() // the write's error is the one to report
		return err
	}
	return f.Close()
}

// CSVHeader names the columns of results.csv.
var CSVHeader = []string{"sweep", "workload", "target_rate", "peers", "method", "rate", "reached", "p50_us", "p99_us",
	"baseline_rate", "baseline_p50_us", "baseline_p99_us", "tracer_cpu_pct", "kernel_cpu_pct", "total_cpu_pct",
	"kernel_ns_per_rt", "true_edges", "found_edges", "recall", "records", "losses", "kernel_rate", "retries",
	"kernel_runs_per_rt", "floor_ns_per_run", "net_kernel_cpu_pct", "net_total_cpu_pct", "net_kernel_ns_per_rt"}

func (r Row) csv() []string {
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	us := func(d time.Duration) string { return f(float64(d.Microseconds()), 0) }
	return []string{r.Sweep, r.Workload, f(r.TargetRate, 0), strconv.Itoa(r.Peers), r.Method, f(r.Rate, 0), strconv.FormatBool(r.Reached),
		us(r.P50), us(r.P99), f(r.BaselineRate, 0), us(r.BaselineP50), us(r.BaselineP99), f(r.TracerCPU, 3), f(r.KernelCPU, 3),
		f(r.TotalCPU(), 3), f(r.KernelNsPerRT, 0), strconv.Itoa(r.TrueEdges), strconv.Itoa(r.FoundEdges), f(r.Recall, 4),
		strconv.Itoa(r.Records), strconv.FormatUint(r.Losses, 10), f(r.KernelRate, 0), strconv.Itoa(r.Retries),
		f(r.KernelRunsPerRT, 2), f(r.FloorNs, 1), f(r.NetKernelCPU(), 3), f(r.NetTotalCPU(), 3), f(r.NetKernelNsPerRT(), 0)}
}

// ReadResults parses a results.json written by WriteResults.
func ReadResults(path string) ([]Row, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rows []Row
	if err := json.Unmarshal(data, &rows); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return rows, nil
}

// WriteCompareMarkdown prints the rows as the tables of docs/benchmarks.md.
func WriteCompareMarkdown(w io.Writer, rows []Row, c CompareConfig) {
	if c.Duration > 0 {
		sched := ""
		if c.Realtime {
			sched = ", loads under SCHED_FIFO"
		}
		fmt.Fprintf(w, "Sweep: %s per run, flows handed over every %s, %d clients (tcp-short, udp), %d connections (tcp-persistent), %d-byte messages%s; every run reached %.0f %% of its rate or was made again (at most %d runs).\n\n",
			c.Duration, c.Interval, c.Concurrency, c.Persistent, c.MsgSize, sched, c.MinReached*100, max(c.Attempts, 1))
	}
	retried := 0
	for _, r := range rows {
		retried += r.Retries
	}
	if retried > 0 {
		fmt.Fprintf(w, "Runs made again because they fell short of the rate: %d.\n\n", retried)
	}
	fmt.Fprintln(w, "Kernel figures: as bpf_stats measures them, and net of its own clock reads (runs per round trip × the floor of an empty program, measured in the same run); neither holds the kernel's dispatch to the programs.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| sweep | workload | target/s | peers | method | achieved/s | reached | tracer process CPU % | kernel programs CPU %, measured / net | total CPU %, measured / net | kernel ns per round trip, measured / net | program runs per round trip | records | recall | losses |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		kernel := fmt.Sprintf("%.2f / %.2f", r.KernelCPU, r.NetKernelCPU())
		total := fmt.Sprintf("%.2f / %.2f", r.TotalCPU(), r.NetTotalCPU())
		ns := fmt.Sprintf("%.0f / %.0f", r.KernelNsPerRT, r.NetKernelNsPerRT())
		runs := fmt.Sprintf("%.1f", r.KernelRunsPerRT)
		switch {
		case r.Method == Polling:
			kernel, total, ns, runs = "-", fmt.Sprintf("%.2f", r.TotalCPU()), "-", "-"
		case !r.NetMeasured():
			kernel, total, ns, runs = fmt.Sprintf("%.2f / -", r.KernelCPU), fmt.Sprintf("%.2f / -", r.TotalCPU()), fmt.Sprintf("%.0f / -", r.KernelNsPerRT), "-"
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %d | %s | %.0f | %v | %.2f | %s | %s | %s | %s | %d | %.3f | %d |\n",
			r.Sweep, r.Workload, r.TargetRate, r.Peers, r.Method, r.Rate, r.Reached, r.TracerCPU, kernel, total, ns, runs, r.Records, r.Recall, r.Losses)
	}
	fmt.Fprintln(w, "\nThroughput and latency of the load, traced against the untraced baseline run of the same point:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| sweep | workload | target/s | peers | method | baseline/s | traced/s | baseline p50 / p99 | traced p50 / p99 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %.0f | %d | %s | %.0f | %.0f | %s / %s | %s / %s |\n",
			r.Sweep, r.Workload, r.TargetRate, r.Peers, r.Method, r.BaselineRate, r.Rate,
			r.BaselineP50.Round(time.Microsecond), r.BaselineP99.Round(time.Microsecond), r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
	}
}

package measure

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/loadgen"
	"github.com/deptrace/deptrace/internal/output"
	"github.com/deptrace/deptrace/tracer"
)

// PairedLoad is one paced load of the whole-machine measurement.
type PairedLoad struct {
	Name     string
	Workload string
	Rate     float64 // round trips (connections) per second, over all clients
	Clients  int     // emulated client hosts (127.1.x.y sources); 0 = one
	// AboveReach marks a load that asks more than the machine gives, on
	// purpose (as fast as it goes, paced so as not to burst): its runs
	// are checked against each other, not against Rate.
	AboveReach bool
}

// PairedResult is the extra CPU of the whole machine that tracing costs at
// one fixed rate, from interleaved runs with and without deptrace.
type PairedResult struct {
	Load PairedLoad
	// ExtraUs is, per pair, (busy CPU traced - busy CPU untraced) divided
	// by the traced run's round trips, in microseconds of CPU.
	ExtraUs []float64
	// Rates achieved, untraced and traced, per pair.
	BaseRates, TracedRates []float64
	// BusyBase and BusyTraced are the whole machine's busy CPU, % of one
	// core, per pair.
	BusyBase, BusyTraced []float64
	// Attribution splits the extra CPU by what deptrace runs (attribute.go),
	// when Paired was asked for it.
	Attribution Attribution
	// BusySources are where the busy CPU times came from (busyClock), one
	// entry per source the runs used.
	BusySources []string
	// TicksPerBusy is, for each run whose busy time came from the idle
	// residency, /proc/stat's busy ticks over the same run divided by it:
	// how far the tick-sampled figure would have been off.
	TicksPerBusy []float64
}

// Median of the extra CPU per round trip, µs.
func (r PairedResult) Median() float64 { return quantile(r.ExtraUs, 0.5) }

// Spread is the 25th and 75th percentile of the extra CPU per round trip.
func (r PairedResult) Spread() (lo, hi float64) {
	return quantile(r.ExtraUs, 0.25), quantile(r.ExtraUs, 0.75)
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	lo := int(pos)
	if lo+1 >= len(s) {
		return s[lo]
	}
	return s[lo] + (pos-float64(lo))*(s[lo+1]-s[lo])
}

// PairedConfig says how the paired runs are made.
type PairedConfig struct {
	Pairs int
	Phase time.Duration // length of each run
	// Attribute samples every run with perf as well (attribute.go).
	Attribute bool
	// Hollow measures the kernel's floor in place of deptrace: one empty
	// program on each hook deptrace runs on this kernel (hollow.go).
	Hollow bool
	// MinReached is the fraction of its rate each run of a pair must
	// reach (0: no check), see checkPair.
	MinReached float64
	// Realtime runs the loads that are not asked above reach under
	// SCHED_FIFO (loadgen.Realtime).
	Realtime bool
	// HollowSet names the hook set of the empty programs (floor.go);
	// empty: the hooks deptrace runs today.
	HollowSet string
	// DNS runs deptrace's DNS watcher beside the tracer, as trace and the
	// agent do by default (internal/dnswatch), offered the tracer's calls
	// as they do: DNSVariant's programs (one of the per-packet variants,
	// or call, whose programs go in the tracer's calls), or ("") what they
	// load: the per-call programs in the tracer's calls from 6.3, else the
	// first per-packet variant.
	DNS        bool
	DNSVariant string
	// Method runs one of bench compare's methods (Methods) in place of
	// deptrace, collected every second as compare runs it: the whole
	// machine's cost of each method, the kernel's dispatch to its
	// programs included, which bpf_stats does not see. "": deptrace as
	// trace runs it.
	Method string
}

// tracedSide names what the pairs' traced runs run, for tables.
func (c PairedConfig) tracedSide() string {
	if c.Method != "" {
		return "bench compare's " + c.Method + " method"
	}
	return "deptrace"
}

// Paired runs each load cfg.Pairs times without and with deptrace (tracer
// loaded and drained every second as the agent does), alternating, and
// measures the busy CPU of the whole machine from /proc/stat (idle,
// iowait and steal excluded) during each run. It needs no bpf_stats: it is
// the cost as a user feels it, both ends of every connection included.
func Paired(ctx context.Context, loadCmd []string, loads []PairedLoad, cfg PairedConfig, progress io.Writer) ([]PairedResult, error) {
	var out []PairedResult
	pairs, phase, attribute := cfg.Pairs, cfg.Phase, cfg.Attribute
	perfDir := ""
	if attribute {
		if err := checkPerf(); err != nil {
			return nil, err
		}
		d, err := os.MkdirTemp("", "deptrace-perf-")
		if err != nil {
			return nil, err
		}
		defer func() { _ = os.RemoveAll(d) }() // a scratch dir; a leftover in the temp dir is harmless
		perfDir = d
	}
	var hollowHooks []string
	if cfg.Hollow {
		set := cfg.HollowSet
		if set == "" {
			set = "deptrace"
		}
		hooks, err := HollowSetHooks(set)
		if err != nil {
			return nil, err
		}
		hollowHooks = hooks
		fmt.Fprintf(progress, "bench: empty programs in place of deptrace, on %s\n", strings.Join(hooks, ", "))
	}
	// measure runs the load once, under perf when attributing.
	measure := func(l PairedLoad) (r pairRun, err error) {
		var wall time.Duration
		run := func() error {
			r.res, r.busy, r.ticks, wall, r.source, err = busyDuring(ctx, loadCmd, l, phase, cfg.Realtime && !l.AboveReach)
			return err
		}
		if !attribute {
			err = run()
			return r, err
		}
		if r.samples, err = attributeRun(perfDir, phase, run); err == nil {
			below, above := busyTolerances(r.source)
			err = checkBusyAgrees(r.samples, r.busy, r.source, wall, below, above)
		}
		return r, err
	}
	// start puts the traced side in place: deptrace draining every second
	// and formatting its flows, or the empty programs alone.
	start := func() (stop func(), err error) {
		if cfg.Hollow {
			h, err := AttachHollow(hollowHooks)
			if err != nil {
				return nil, err
			}
			return h.Close, nil
		}
		if cfg.Method != "" {
			m, err := NewMethod(cfg.Method)
			if err != nil {
				return nil, fmt.Errorf("load the %s method: %w", cfg.Method, err)
			}
			stopCollect := every(time.Second, func() { _, _ = m.Collect() }) // as compare drains it
			return func() {
				stopCollect()
				_ = m.Close() // the run is measured; nothing left to report
			}, nil
		}
		t, err := tracer.New(tracer.DefaultConfig())
		if err != nil {
			return nil, fmt.Errorf("load tracer: %w", err)
		}
		var dns *dnswatch.Watcher
		if cfg.DNS {
			dcfg := dnswatch.DefaultConfig()
			dcfg.Variant = cfg.DNSVariant
			dcfg.Calls = t // as trace and agent do
			if dns, err = dnswatch.New(dcfg); err != nil {
				_ = t.Close() // the watcher's error is the one to report
				return nil, fmt.Errorf("load the DNS watcher: %w", err)
			}
		}
		agentCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			sink, _ := output.New("jsonl", io.Discard, nil, time.Second) // format, and reuse flows, as trace does
			done <- t.RunWith(agentCtx, tracer.RunOptions{ReuseFlows: true}, func(iv tracer.Interval) error {
				if dns != nil {
					dns.Apply(&iv) // names flows and counts lookups, as trace does
				}
				return sink.Write(iv.Flows, iv.Listeners)
			})
		}()
		return func() {
			cancel()
			<-done //nolint:errcheck // a stop on purpose: Run's error is the cancellation
			if dns != nil {
				_ = dns.Close() // out of the tracer's calls first, as trace does; nothing left to report
			}
			_ = t.Close() // likewise
		}, nil
	}
	for _, l := range loads {
		r := PairedResult{Load: l}
		for i := 0; i < pairs; i++ {
			fmt.Fprintf(progress, "bench: paired %s: pair %d/%d\n", l.Name, i+1, pairs)
			what := fmt.Sprintf("paired %s, pair %d", l.Name, i+1)
			base, traced, err := makePair(what, func() (pairRun, error) { return measure(l) }, start,
				func(base, traced loadgen.Result) error { return checkPair(what, l, base, traced, cfg.MinReached) }, progress)
			if err != nil {
				return out, err
			}
			baseBusy, tracedBusy, source := pairBusy(base, traced)
			extra := (tracedBusy - baseBusy).Seconds() / float64(max(traced.res.RoundTrips, 1)) * 1e6
			r.ExtraUs = append(r.ExtraUs, extra)
			if attribute {
				r.Attribution.addPair(base.samples, traced.samples, int64(base.res.RoundTrips), int64(traced.res.RoundTrips))
			}
			r.BaseRates = append(r.BaseRates, base.res.Rate)
			r.TracedRates = append(r.TracedRates, traced.res.Rate)
			r.BusyBase = append(r.BusyBase, baseBusy.Seconds()/base.res.Elapsed.Seconds()*100)
			r.BusyTraced = append(r.BusyTraced, tracedBusy.Seconds()/traced.res.Elapsed.Seconds()*100)
			if !slices.Contains(r.BusySources, source) {
				r.BusySources = append(r.BusySources, source)
			}
			if source == busyFromIdleStates {
				for _, run := range []pairRun{base, traced} {
					if run.busy > 0 {
						r.TicksPerBusy = append(r.TicksPerBusy, run.ticks.Seconds()/run.busy.Seconds())
					}
				}
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// pairAttempts is how often a pair whose runs fall short (checkPair), or
// whose perf samples cannot be used (errPerfUnusable), is made before the
// measurement fails.
const pairAttempts = 3

// pairRun is one run of a pair: the load's result, the machine's busy CPU
// over it, and perf's samples when attributing.
type pairRun struct {
	res     loadgen.Result
	busy    time.Duration
	ticks   time.Duration // /proc/stat's busy ticks over the same run
	source  string        // of busy (busyClock)
	samples SampleCounts
}

// makePair makes one pair: measure untraced, start the traced side,
// measure again, stop it. A pair whose runs cannot be compared (check) or
// whose perf samples cannot be used is made again, pairAttempts times in
// all; any other error ends the measurement at once. what names the pair
// in errors and progress lines; a progress line marks each traced run.
func makePair(what string, measure func() (pairRun, error), start func() (stop func(), err error),
	check func(base, traced loadgen.Result) error, progress io.Writer) (base, traced pairRun, err error) {
	for attempt := 1; ; attempt++ {
		var again error // why this attempt's runs cannot be used
		if base, err = measure(); err != nil {
			if again = fmt.Errorf("%s, untraced run: %w", what, err); !errors.Is(err, errPerfUnusable) {
				return base, traced, again
			}
		}
		if again == nil {
			stop, err := start()
			if err != nil {
				return base, traced, err
			}
			fmt.Fprintf(progress, "bench: %s: traced run\n", what)
			traced, err = measure()
			stop()
			if err != nil {
				if again = fmt.Errorf("%s, traced run: %w", what, err); !errors.Is(err, errPerfUnusable) {
					return base, traced, again
				}
			}
		}
		if again == nil {
			again = check(base.res, traced.res)
		}
		if again == nil {
			return base, traced, nil
		}
		if attempt >= pairAttempts {
			return base, traced, fmt.Errorf("%w (%d tries)", again, attempt)
		}
		fmt.Fprintf(progress, "bench: %v; running the pair again (%d of %d)\n", again, attempt+1, pairAttempts)
	}
}

// checkPair says, in one line, why a pair's two runs cannot be compared:
// a run below min (a fraction) of the asked rate, or, for a load asked
// above reach, traced and untraced rates further apart than
// DefaultTolerance (the extra CPU per round trip assumes the same load).
// min 0 checks nothing.
func checkPair(what string, l PairedLoad, base, traced loadgen.Result, min float64) error {
	if min <= 0 {
		return nil
	}
	if l.AboveReach {
		if d := math.Abs(traced.Rate-base.Rate) / math.Max(base.Rate, 1); d > DefaultTolerance {
			return fmt.Errorf("%s: traced run %.0f/s and untraced run %.0f/s are %.0f %% apart (tolerance %.0f %%)", what, traced.Rate, base.Rate, d*100, DefaultTolerance*100)
		}
		return nil
	}
	if err := CheckReached(what+", untraced run", base, l.Rate, min); err != nil {
		return err
	}
	return CheckReached(what+", traced run", traced, l.Rate, min)
}

// pairBusy is the busy time of a pair's two runs from one source: the
// residency and the ticks differ by a quarter and more per run, so a pair
// whose runs came from different sources (a reading fell back to ticks)
// compares both runs' ticks.
func pairBusy(base, traced pairRun) (baseBusy, tracedBusy time.Duration, source string) {
	if base.source != traced.source {
		return base.ticks, traced.ticks, busyFromTicks
	}
	return base.busy, traced.busy, base.source
}

// How far the busy CPU perf's samples stand for may be from the busy
// time measured (busyClock), relative to the larger, by its source.
//
// From /proc/stat the bounds differ because its busy
// time is tick-sampled (CONFIG_TICK_CPU_ACCOUNTING, HZ 250 here): with the
// tick stopped in idle (NO_HZ_IDLE), a burst of work that ends before the
// next tick is charged to nobody, so on light, bursty loads /proc/stat
// reads low and perf's cpu-clock samples, taken every 200 us, read higher
// (perf 505 ms against /proc/stat's 430 ms at 1,000 UDP round trips/s;
// 17 to 24 % on the pairs' lighter loads); its ticks read high by chance
// too.
//
// The cpuidle residency is not sampled: perf reads below it by what
// interrupts do on a CPU that left an idle state (perf gives those samples
// to the idle task), 4-13 % on the pairs' loads here (untraced UDP
// 0.874-0.905 of it, short-lived TCP 0.937-0.962, 6 runs each); it can
// read above it by its sampling error only.
func busyTolerances(source string) (below, above float64) {
	if source == busyFromIdleStates {
		return 0.20, 0.10
	}
	return 0.15, 0.35
}

// errPerfUnusable is checkBusyAgrees' failure: perf's samples of the run
// are missing, lost or do not add up to the run's busy time, and the
// pair is made again (pairAttempts), as one whose load fell short is.
var errPerfUnusable = errors.New("perf's samples unusable")

// checkBusyAgrees checks the attribution's whole against the busy time
// measured from source: the attribution counts each sample as 1/perfFreq
// s of CPU, so the samples not of the idle task must add up to that busy
// time over the same run, within below (perf lower) and above (perf
// higher).
// (Their share of all samples would not do: cpu-clock samples an idle
// CPU less often than its frequency on this kernel.)
func checkBusyAgrees(c SampleCounts, busy time.Duration, source string, wall time.Duration, below, above float64) error {
	if c.All == 0 || busy <= 0 {
		return fmt.Errorf("%w: perf took no sample of the run (%d samples, %s busy over %s)", errPerfUnusable, c.All, busy, wall)
	}
	if c.Lost > 0 {
		return fmt.Errorf("%w: perf lost %d samples or events of the run (perf report --stats): its counts are short", errPerfUnusable, c.Lost)
	}
	perf := time.Duration(float64(c.All-c.Idle) / perfFreq * float64(time.Second))
	d := (perf.Seconds() - busy.Seconds()) / math.Max(perf.Seconds(), busy.Seconds())
	tol, side := above, "above"
	if d < 0 {
		tol, side = below, "below"
	}
	if math.Abs(d) > tol {
		return fmt.Errorf("%w: perf's %d busy samples at %d Hz stand for %s of CPU, %s gives %s over the same %s: %.0f %% %s it, tolerance %.0f %%", errPerfUnusable,
			c.All-c.Idle, perfFreq, perf.Round(10*time.Millisecond), source, busy.Round(10*time.Millisecond), wall.Round(time.Millisecond), math.Abs(d)*100, side, tol*100)
	}
	return nil
}

// pairedClients is the number of clients of a paced paired load: the
// most round trips in flight, with room for latency spikes (64 at
// 5,000/s leave 12.8 ms of mean latency). Persistent connections stay 8.
const pairedClients = 64

// busyDuring runs the load process and returns the machine's busy CPU time
// over the load's run, /proc/stat's busy ticks over it, the wall time it
// was measured over and the source of the busy time (busyClock).
func busyDuring(ctx context.Context, loadCmd []string, l PairedLoad, phase time.Duration, realtime bool) (res loadgen.Result, busy, ticks, wall time.Duration, source string, err error) {
	clients := pairedClients
	if l.Workload == loadgen.TCPPersistent {
		clients = 8
	}
	args := append([]string{}, loadCmd[1:]...)
	args = append(args, "--workload", l.Workload, "--rate", strconv.FormatFloat(l.Rate, 'f', -1, 64),
		"--concurrency", strconv.Itoa(clients), "--duration", phase.String(), "--serve", "127.0.0.1:0", "--output", "json")
	if l.Clients > 0 {
		args = append(args, "--clients", strconv.Itoa(l.Clients))
	}
	if realtime {
		args = append(args, "--realtime")
	}
	c0, err := readBusyClock()
	if err != nil {
		return loadgen.Result{}, 0, 0, 0, "", err
	}
	t0 := time.Now()
	res, err = runLoadProcess(ctx, loadCmd[0], args)
	wall = time.Since(t0)
	c1, err2 := readBusyClock()
	if err == nil {
		err = err2
	}
	busy, source = c1.busySince(c0)
	return res, busy, c1.ticks - c0.ticks, wall, source, err
}

// WritePairedMarkdown renders the paired measurement.
func WritePairedMarkdown(w io.Writer, rs []PairedResult, cfg PairedConfig) {
	traced := "traced with the tracer draining every second"
	if cfg.Method != "" {
		traced = "traced by " + cfg.tracedSide() + ", collected every second"
	} else if cfg.Hollow {
		traced = "traced by empty programs alone, one on each hook deptrace runs on this kernel: the floor of any program there"
	} else if cfg.DNS && cfg.DNSVariant != "" {
		traced += " and the DNS watcher on, its " + cfg.DNSVariant + " programs"
		if cfg.DNSVariant == "call" {
			traced += " in the tracer's send and receive calls"
		}
	} else if cfg.DNS {
		traced += " and the DNS watcher on, as trace and the agent run by default"
	}
	var sources []string
	for _, r := range rs {
		for _, src := range r.BusySources {
			if d := describeBusySource(src); !slices.Contains(sources, d) {
				sources = append(sources, d)
			}
		}
	}
	if len(sources) == 0 {
		sources = []string{"no run"}
	}
	fmt.Fprintf(w, "Whole machine, %d interleaved pairs of %s runs per load (untraced, then %s); busy CPU from %s. Extra CPU per round trip = (busy traced - busy untraced) / round trips.\n\n", cfg.Pairs, cfg.Phase, traced, strings.Join(sources, " and "))
	fmt.Fprintln(w, "| load | target rate/s | rate untraced (median) | rate traced (median) | busy untraced | busy traced | extra CPU per round trip, median | 25th-75th percentile |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		lo, hi := r.Spread()
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %.1f %% | %.1f %% | %.2f µs | %.2f to %.2f µs |\n", r.Load.Name, r.Load.Rate,
			quantile(r.BaseRates, 0.5), quantile(r.TracedRates, 0.5), quantile(r.BusyBase, 0.5), quantile(r.BusyTraced, 0.5), r.Median(), lo, hi)
	}
	var ticks []string
	for _, r := range rs {
		if len(r.TicksPerBusy) > 0 {
			ticks = append(ticks, fmt.Sprintf("%s %.2f-%.2f", r.Load.Name, slices.Min(r.TicksPerBusy), slices.Max(r.TicksPerBusy)))
		}
	}
	if len(ticks) > 0 {
		fmt.Fprintf(w, "\n/proc/stat's busy ticks over the same runs, against the busy time above (lowest-highest run): %s.\n", strings.Join(ticks, ", "))
	}
}

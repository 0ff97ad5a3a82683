// Command deptrace-bench holds deptrace's benchmarks: a TCP/UDP echo load
// generator, the overhead measurement and the comparison of tracing
// methods with its plots. It is a binary of its own so that the
// production deptrace binary links no benchmark or plotting code.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/bench/internal/measure"
	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/loadgen"
)

func main() { cli.Main(newRootCmd()) }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "deptrace-bench",
		Short: "Load generator and overhead benchmarks of deptrace",
		Long: `deptrace-bench drives loads and measures deptrace's cost (overhead) and how
bundling compares with polling, streaming and per-5-tuple aggregation (compare).

Every flag can also be set from the environment: --duration is
DEPTRACE_DURATION, and so on.`,
	}
	cli.Configure(root)
	root.AddCommand(newBenchLoadCmd(), newBenchServeCmd(), newBenchOverheadCmd(), newBenchCompareCmd(), newBenchReportCmd())
	return root
}

func newBenchLoadCmd() *cobra.Command {
	var (
		cfg      loadgen.Config
		addrs    []string
		serve    string
		ports    int
		clients  int
		format   string
		realtime bool
	)
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Drive a TCP/UDP echo load, paced or as fast as it goes",
		Long: `load runs echo clients against --addr servers (or against its own, with
--serve) and reports the achieved rate, errors, latency percentiles and the
ground truth: every client-server edge that completed a round trip. With
--rate the load is open loop: each start goes to whichever of the
--concurrency clients is free, and starts more than 100 ms late are dropped
and counted (missed); a rate it cannot reach is reported as reached=false,
never silently. --clients N spreads client source addresses
over N loopback addresses (127.1.0.1...) to emulate N client hosts; --ports N
makes --serve listen on N consecutive ports to emulate N services.`,
		Example: `  deptrace-bench load --serve 127.0.0.1:0 --workload tcp-short --duration 10s
  deptrace-bench load --serve 127.0.0.1:20000 --ports 100 --clients 1000 --rate 10000 --workload udp
  deptrace-bench load --addr 127.0.0.1:7000 --workload tcp-persistent --concurrency 100 --rate 5000`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return fmt.Errorf("invalid --output %q: allowed table, json", format)
			}
			if realtime {
				if cfg.Rate == 0 {
					return fmt.Errorf("--realtime needs a --rate: a load as fast as it goes would take the whole machine")
				}
				if err := loadgen.Realtime(); err != nil {
					return fmt.Errorf("--realtime: %w", err)
				}
			}
			var err error
			if cfg.Sources, err = loadgen.Sources(clients); err != nil {
				return flagError(err, "serve")
			}
			cfg.Addrs = addrs
			if serve != "" {
				bound, err := loadgen.Serve(cmd.Context(), serve, ports)
				if err != nil {
					return flagError(err, "serve")
				}
				cfg.Addrs = append(cfg.Addrs, bound...)
			}
			if len(cfg.Addrs) == 0 {
				return fmt.Errorf("missing --addr (server host:port) or --serve (start echo servers here)")
			}
			if err := cfg.Validate(); err != nil {
				return flagError(err, "serve")
			}
			r, err := loadgen.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if format == "json" {
				return json.NewEncoder(os.Stdout).Encode(r)
			}
			target := "as fast as possible"
			if r.TargetRate > 0 {
				target = fmt.Sprintf("target %.0f/s, reached=%v", r.TargetRate, r.Reached)
			}
			fmt.Printf("%s: %d round trips in %s = %.0f/s (%s, %d starts missed), %d errors, %d edges, p50 %s p90 %s p99 %s max %s\n",
				r.Workload, r.RoundTrips, r.Elapsed.Round(time.Millisecond), r.Rate, target, r.Missed, r.Errors, len(r.Edges), r.P50, r.P90, r.P99, r.Max)
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.Workload, "workload", loadgen.TCPShort, "workload: "+strings.Join(loadgen.Workloads, ", "))
	cmd.Flags().StringSliceVar(&addrs, "addr", nil, "echo server addresses host:port (comma list)")
	cmd.Flags().StringVar(&serve, "serve", "", "start echo servers here: first address ip:port (port 0 picks one)")
	cmd.Flags().IntVar(&ports, "ports", 1, "with --serve: listen on this many consecutive ports (emulated services)")
	cmd.Flags().IntVar(&clients, "clients", 0, "emulated client hosts: source addresses 127.1.0.1 onwards (0: kernel's choice)")
	cmd.Flags().IntVar(&cfg.Concurrency, "concurrency", 8, "parallel clients (with --rate: the most round trips in flight), or connections held open (1 to 10000)")
	cmd.Flags().Float64Var(&cfg.Rate, "rate", 0, "target round trips (tcp-short: connections) per second over all clients; 0 = as fast as possible")
	cmd.Flags().IntVar(&cfg.MsgSize, "msg-size", 64, "bytes per request and response (1 to 65000)")
	cmd.Flags().DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to drive the load")
	cmd.Flags().StringVarP(&format, "output", "o", "table", "table or json")
	cmd.Flags().BoolVar(&realtime, "realtime", false, "run the load under SCHED_FIFO (root), so that other work on the machine cannot hold a paced load below its rate")
	// As loadgen's errors say, for a value that does not parse.
	allowed(cmd, map[string]string{"ports": "1 to 20000", "clients": "0 to 65000", "concurrency": "1 to 10000",
		"rate": "0 (as fast as possible) to 10000000", "msg-size": "1 to 65000", "duration": "above 0 up to 24h"})
	return cmd
}

// flagError names the flag in loadgen's "invalid ports 0: allowed ..."
// errors: its fields are named as load's and serve's flags, but for the
// echo servers' address, which is serveFlag (load's --serve, serve's
// --addr). Other errors (a port in use) are returned as they are.
func flagError(err error, serveFlag string) error {
	msg, ok := strings.CutPrefix(err.Error(), "invalid ")
	if !ok {
		return err
	}
	if rest, ok := strings.CutPrefix(msg, "serve address "); ok {
		return fmt.Errorf("invalid --%s %s", serveFlag, rest)
	}
	return fmt.Errorf("invalid --%s", msg)
}

func newBenchServeCmd() *cobra.Command {
	var (
		addr  string
		ports int
	)
	cmd := &cobra.Command{
		Use:     "serve",
		Short:   "Run TCP and UDP echo servers until interrupted",
		Example: `  deptrace-bench serve --addr 127.0.0.1:20000 --ports 1000`,
		Args:    cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), cli.StopSignals()...)
			defer stop()
			bound, err := loadgen.Serve(ctx, addr, ports)
			if err != nil {
				return flagError(err, "addr")
			}
			fmt.Printf("serving tcp+udp echo on %s", bound[0])
			if len(bound) > 1 {
				fmt.Printf(" .. %s (%d ports)", bound[len(bound)-1], len(bound))
			}
			fmt.Println()
			<-ctx.Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:7000", "first address ip:port")
	cmd.Flags().IntVar(&ports, "ports", 1, "number of consecutive ports")
	allowed(cmd, map[string]string{"ports": "1 to 20000"})
	return cmd
}

func newBenchOverheadCmd() *cobra.Command {
	cfg := measure.OverheadConfig{}
	var workloads string
	var pairs int
	var pairPhase time.Duration
	var attribute, hollow, dns bool
	var dnsVariant string
	var minReached float64
	var realtime bool
	var hollowSet, pairLoads, pairMethod string
	cmd := &cobra.Command{
		Use:   "overhead",
		Short: "Measure deptrace's own cost under a loopback load (root)",
		Long: `overhead runs each workload four times in its own process: without deptrace,
with the tracer attached (agent CPU; bpf_stats off), with bpf_stats on (run time
of every kernel program), and without deptrace again (the noise floor). Then
the whole-machine pairs: each load at a fixed rate, alternately without and
with deptrace, busy CPU from the cpuidle residency counters (or /proc/stat's
ticks without cpuidle states on every online CPU, or where it cannot run on
each CPU); with --attribute, perf samples every
run and the extra CPU is split by what deptrace runs (its programs, the
kernel's dispatch to them, helpers, the agent). With --hollow, the pairs'
traced runs have one empty program on each hook deptrace runs on this kernel
in place of deptrace: the floor any program there costs. With --pair-method,
they run one of bench compare's methods instead (bundling is deptrace's
tracer without its output; streaming the per-event baseline): each method's
cost to the whole machine, with the kernel's dispatch to its programs that
bpf_stats leaves out. It prints Markdown tables for docs/performance.md.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Interrupted, the runs stop and clean up: the load, the
			// tracer, perf and its files.
			ctx, stop := signal.NotifyContext(cmd.Context(), cli.StopSignals()...)
			defer stop()
			if cfg.Duration < time.Second || cfg.Duration > time.Hour {
				return fmt.Errorf("invalid --duration %s: allowed 1s to 1h", cfg.Duration)
			}
			if workloads != "" {
				cfg.Workloads = strings.Split(workloads, ",")
			}
			probe := loadgen.Config{Concurrency: cfg.Concurrency, MsgSize: cfg.MsgSize, Duration: cfg.Duration, Addrs: []string{"127.0.0.1:1"}}
			for _, w := range cfg.Workloads {
				probe.Workload = w
				if err := probe.Validate(); err != nil {
					return fmt.Errorf("--%s", strings.TrimPrefix(err.Error(), "invalid "))
				}
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find own binary: %w", err)
			}
			cfg.LoadCommand = []string{self, "load"}
			if pairs < 0 || pairs > 1000 {
				return fmt.Errorf("invalid --pairs %d: allowed 0 (skip the whole-machine measurement) to 1000", pairs)
			}
			if pairs > 0 && (pairPhase < time.Second || pairPhase > time.Hour) {
				return fmt.Errorf("invalid --pair-phase %s: allowed 1s to 1h", pairPhase)
			}
			if minReached < 0 || minReached > 1 {
				return fmt.Errorf("invalid --min-reached %g: allowed 0 (no check) to 1", minReached)
			}
			loads, err := selectPairedLoads(pairLoads)
			if err != nil {
				return err
			}
			if attribute && pairs == 0 {
				return fmt.Errorf("--attribute samples the runs of the whole-machine pairs: give --pairs 1 or more")
			}
			if hollowSet != "" && !slices.Contains(measure.HollowSetNames(), hollowSet) {
				return fmt.Errorf("invalid --hollow-set %q: allowed %s", hollowSet, strings.Join(measure.HollowSetNames(), ", "))
			}
			if hollowSet != "" {
				hollow = true
			}
			if hollow && pairs == 0 {
				return fmt.Errorf("--hollow replaces deptrace in the whole-machine pairs: give --pairs 1 or more")
			}
			if dns && (pairs == 0 || hollow) {
				return fmt.Errorf("--dns adds the DNS watcher to deptrace in the whole-machine pairs: give --pairs 1 or more, without --hollow")
			}
			if pairMethod != "" && !slices.Contains(measure.Methods, pairMethod) {
				return fmt.Errorf("invalid --pair-method %q: allowed %s", pairMethod, strings.Join(measure.Methods, ", "))
			}
			if pairMethod != "" && (pairs == 0 || hollow || dns) {
				return fmt.Errorf("--pair-method runs a bench compare method in place of deptrace in the whole-machine pairs: give --pairs 1 or more, without --hollow or --dns")
			}
			if dnsVariant != "" {
				dcfg := dnswatch.DefaultConfig()
				dcfg.Variant = dnsVariant
				if err := dcfg.Validate(); err != nil {
					return fmt.Errorf("invalid --dns-variant %q: allowed %s", dnsVariant, dnswatch.VariantNames())
				}
				if !dns {
					return fmt.Errorf("--dns-variant %s chooses the DNS watcher's programs: give --dns too", dnsVariant)
				}
			}
			// Flags first, so a mistyped command says what is wrong with it.
			if err := kernel.CheckCapabilities(); err != nil {
				return err
			}
			if workloads != "" {
				ms, err := measure.Overhead(ctx, cfg, os.Stderr)
				if len(ms) > 0 {
					measure.WriteMarkdown(os.Stdout, ms, cfg)
				}
				if err != nil {
					return err
				}
			}
			if pairs > 0 {
				pc := measure.PairedConfig{Pairs: pairs, Phase: pairPhase, Attribute: attribute, Hollow: hollow, HollowSet: hollowSet, MinReached: minReached, Realtime: realtime, DNS: dns, DNSVariant: dnsVariant, Method: pairMethod}
				// The loads measured before a failure are printed all
				// the same: a pair failing late loses no finished load.
				rs, err := measure.Paired(ctx, cfg.LoadCommand, loads, pc, os.Stderr)
				if len(rs) > 0 {
					fmt.Println()
					measure.WritePairedMarkdown(os.Stdout, rs, pc)
					if attribute {
						fmt.Println()
						measure.WriteAttributionMarkdown(os.Stdout, rs, pc)
					}
				}
				if err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of each phase (1s to 1h)")
	cmd.Flags().IntVar(&cfg.Concurrency, "concurrency", 8, "clients (short-lived) and connections (persistent)")
	cmd.Flags().IntVar(&cfg.MsgSize, "msg-size", 64, "bytes per request and response")
	cmd.Flags().StringVar(&workloads, "workloads", loadgen.TCPShort+","+loadgen.TCPPersistent+","+loadgen.UDP, "comma list of workloads for the bpf_stats view (empty: skip it)")
	cmd.Flags().Float64Var(&cfg.Rate, "rate", 0, "pace the bpf_stats view's load (round trips/s; 0: flat out)")
	cmd.Flags().IntVar(&pairs, "pairs", 10, "interleaved untraced/traced pairs per load of the whole-machine measurement (0 skips it)")
	cmd.Flags().DurationVar(&pairPhase, "pair-phase", 3*time.Second, "length of each run of a pair")
	cmd.Flags().BoolVar(&realtime, "realtime", true, "run the pairs' paced loads under SCHED_FIFO (deptrace-bench load --realtime), so that other work on the machine does not hold them below their rate")
	cmd.Flags().Float64Var(&minReached, "min-reached", measure.DefaultMinReached, "fraction of its rate each run of a pair must reach, or the pair is made again (3 tries, then an error); 0: no check")
	cmd.Flags().BoolVar(&attribute, "attribute", false, "also sample every run of the pairs with perf and split deptrace's extra CPU by program, dispatch, helpers and agent (needs perf)")
	cmd.Flags().StringVar(&hollowSet, "hollow-set", "", "with --hollow, the hook set of the empty programs (deptrace: today's; sockops...: the alternatives for TCP; implies --hollow)")
	cmd.Flags().StringVar(&pairLoads, "pair-loads", strings.Join(pairedLoadKeys, ","), "comma list of the whole-machine pairs' loads: "+strings.Join(pairedLoadKeys, ", "))
	cmd.Flags().BoolVar(&dns, "dns", false, "in the pairs, run deptrace's DNS watcher beside the tracer, as trace and agent do unless --no-dns")
	cmd.Flags().StringVar(&dnsVariant, "dns-variant", "", "with --dns, the watcher's programs: "+dnswatch.VariantNames()+" (call: in the tracer's send and receive calls; default: as trace and agent do, call from 6.3, else the first per-packet variant the kernel loads)")
	cmd.Flags().StringVar(&pairMethod, "pair-method", "", "in the pairs, run one of bench compare's methods ("+strings.Join(measure.Methods, ", ")+") in place of deptrace, collected every second: each method's cost to the whole machine, dispatch included")
	cmd.Flags().BoolVar(&hollow, "hollow", false, "in the pairs, run one empty program on each hook deptrace uses on this kernel instead of deptrace: the kernel's floor for these hooks")
	allowed(cmd, map[string]string{"duration": "1s to 1h", "pairs": "0 (skip the whole-machine measurement) to 1000", "pair-phase": "1s to 1h",
		"min-reached": "0 (no check) to 1", "concurrency": "1 to 10000", "msg-size": "1 to 65000"})
	return cmd
}

// pairedLoads are the fixed-rate loads of the whole-machine measurement,
// in the order they run; pairedLoadKeys names them for --pair-loads.
var (
	pairedLoads = []measure.PairedLoad{
		{Name: "short-lived TCP", Workload: loadgen.TCPShort, Rate: 5000},
		{Name: "persistent TCP", Workload: loadgen.TCPPersistent, Rate: 40000, AboveReach: true},
		{Name: "UDP, new socket per round trip", Workload: loadgen.UDP, Rate: 5000},
		{Name: "short-lived TCP, 1,000 client hosts", Workload: loadgen.TCPShort, Rate: 5000, Clients: 1000},
	}
	pairedLoadKeys = []string{"tcp-short", "tcp-persistent", "udp", "tcp-short-1000-hosts"}
)

// selectPairedLoads is the paired loads named in list (comma separated
// keys of pairedLoadKeys), in their usual order.
func selectPairedLoads(list string) ([]measure.PairedLoad, error) {
	want := map[string]bool{}
	for _, k := range strings.Split(list, ",") {
		if !slices.Contains(pairedLoadKeys, k) {
			return nil, fmt.Errorf("invalid --pair-loads %q: %q is not a load; allowed a comma list of %s", list, k, strings.Join(pairedLoadKeys, ", "))
		}
		want[k] = true
	}
	var ls []measure.PairedLoad
	for i, k := range pairedLoadKeys {
		if want[k] {
			ls = append(ls, pairedLoads[i])
		}
	}
	return ls, nil
}

func newBenchCompareCmd() *cobra.Command {
	cfg := measure.CompareConfig{}
	var (
		workloads, methods, rates, peers string
		out                              string
	)
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Compare polling, streaming, per-5-tuple aggregation and bundling on the same load (root)",
		Long: `compare sweeps workload x rate x method, and a many-peers sweep, on loopback.
For every point it runs the load once without tracing, then once per method
with the method attached and draining every --interval (the tracer process's
CPU and the recall of true dependencies), then once per eBPF method with
bpf_stats on (kernel program time). Progress goes to stderr; results.csv,
results.json and PNG plots go to --out.

The harness checks itself: a run below --min-reached of the asked rate is
made again, up to --attempts runs, and then stops the sweep with an error
naming what it reached; a row whose kernel programs' CPU disagrees with its
ns per round trip times its rate by more than --tolerance stops it too. The
rows finished before are kept in --out.`,
		Example: `  deptrace-bench compare --out bench-out
  deptrace-bench compare --workloads tcp-short --rates 1000,5000 --peers "" --duration 3s`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := kernel.CheckCapabilities(); err != nil {
				return err
			}
			var err error
			if cfg.Workloads, err = listOf("workloads", workloads, loadgen.Workloads); err != nil {
				return err
			}
			if cfg.Methods, err = listOf("methods", methods, measure.Methods); err != nil {
				return err
			}
			if cfg.Rates, err = floats("rates", rates); err != nil {
				return err
			}
			peerRates, err := floats("peers", peers)
			if err != nil {
				return err
			}
			for _, p := range peerRates {
				if p < 1 || p > 65000 {
					return fmt.Errorf("invalid --peers %g: allowed 1 to 65000", p)
				}
				cfg.Peers = append(cfg.Peers, int(p))
			}
			if !slices.Contains(loadgen.Workloads, cfg.PeersWorkload) {
				return fmt.Errorf("invalid --peers-workload %q: allowed %s", cfg.PeersWorkload, strings.Join(loadgen.Workloads, ", "))
			}
			if cfg.MinReached < 0 || cfg.MinReached > 1 {
				return fmt.Errorf("invalid --min-reached %g: allowed 0 (no check) to 1", cfg.MinReached)
			}
			if cfg.Attempts < 1 || cfg.Attempts > 20 {
				return fmt.Errorf("invalid --attempts %d: allowed 1 to 20", cfg.Attempts)
			}
			if cfg.Tolerance <= 0 || cfg.Tolerance > 1 {
				return fmt.Errorf("invalid --tolerance %g: allowed above 0 up to 1", cfg.Tolerance)
			}
			if cfg.Duration < time.Second || cfg.Interval < 100*time.Millisecond || cfg.Interval > cfg.Duration {
				return fmt.Errorf("invalid --duration %s / --interval %s: allowed duration 1s or more, interval 100ms up to the duration", cfg.Duration, cfg.Interval)
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find own binary: %w", err)
			}
			cfg.LoadCommand = []string{self, "load"}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return fmt.Errorf("create --out %s: %w", out, err)
			}
			var partial []measure.Row
			rows, err := measure.Compare(cmd.Context(), cfg, os.Stderr, func(r measure.Row) {
				partial = append(partial, r)
				_ = measure.WriteResults(out, partial) // keep what is done if the sweep stops
			})
			if err != nil {
				return err
			}
			if err := measure.WriteResults(out, rows); err != nil {
				return err
			}
			files, err := measure.WritePlots(out, rows)
			if err != nil {
				return err
			}
			measure.WriteCompareMarkdown(os.Stdout, rows, cfg)
			fmt.Fprintf(os.Stderr, "bench: wrote %s, %s and %d plots\n", filepath.Join(out, "results.csv"), filepath.Join(out, "results.json"), len(files))
			return nil
		},
	}
	cmd.Flags().StringVar(&workloads, "workloads", strings.Join(loadgen.Workloads, ","), "workloads to sweep")
	cmd.Flags().StringVar(&methods, "methods", strings.Join(measure.Methods, ","), "methods to compare")
	cmd.Flags().StringVar(&rates, "rates", "2500,5000,7500,10000", "target rates per second to sweep")
	cmd.Flags().StringVar(&peers, "peers", "200,400,600,800,1000", "emulated client hosts for the many-peers sweep (empty: skip it)")
	cmd.Flags().Float64Var(&cfg.PeersRate, "peers-rate", 5000, "rate of the many-peers sweep")
	cmd.Flags().StringVar(&cfg.PeersWorkload, "peers-workload", loadgen.TCPShort, "workload of the many-peers sweep")
	cmd.Flags().DurationVar(&cfg.Duration, "duration", 5*time.Second, "length of each run")
	cmd.Flags().DurationVar(&cfg.Interval, "interval", time.Second, "how often each method hands over its flows")
	cmd.Flags().IntVar(&cfg.Concurrency, "concurrency", 64, "clients for tcp-short and udp: the most round trips in flight")
	cmd.Flags().IntVar(&cfg.Persistent, "persistent", 100, "connections held open for tcp-persistent")
	cmd.Flags().IntVar(&cfg.MsgSize, "msg-size", 64, "bytes per request and response")
	cmd.Flags().BoolVar(&cfg.KernelStats, "kernel-stats", true, "also measure kernel program time (one more run per eBPF method)")
	cmd.Flags().BoolVar(&cfg.Realtime, "realtime", true, "run the load under SCHED_FIFO (deptrace-bench load --realtime), so that other work on the machine does not hold it below its rate")
	cmd.Flags().Float64Var(&cfg.MinReached, "min-reached", measure.DefaultMinReached, "fraction of the asked rate every run must reach (0: no check)")
	cmd.Flags().IntVar(&cfg.Attempts, "attempts", measure.DefaultAttempts, "runs of a point's run that falls short before the sweep fails")
	cmd.Flags().Float64Var(&cfg.Tolerance, "tolerance", measure.DefaultTolerance, "how far a row's kernel CPU may disagree with ns per round trip × rate (fraction)")
	cmd.Flags().StringVar(&out, "out", "bench-out", "directory for results.csv, results.json and plots")
	allowed(cmd, map[string]string{"min-reached": "0 (no check) to 1", "attempts": "1 to 20", "tolerance": "above 0 up to 1"})
	return cmd
}

// allowed records what each named flag of cmd takes, as its range check
// says, for the error of a value that does not even parse as its type.
func allowed(cmd *cobra.Command, ranges map[string]string) {
	for name, text := range ranges {
		cli.SetAllowed(cmd.Flags(), name, text)
	}
}

func listOf(flag, v string, allowed []string) ([]string, error) {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(allowed, s) {
			return nil, fmt.Errorf("invalid --%s %q: allowed %s", flag, s, strings.Join(allowed, ", "))
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("invalid --%s: give at least one of %s", flag, strings.Join(allowed, ", "))
	}
	return out, nil
}

func floats(flag, v string) ([]float64, error) {
	var out []float64
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f <= 0 || f > 10_000_000 {
			return nil, fmt.Errorf("invalid --%s %q: allowed positive numbers up to 10000000, comma separated", flag, s)
		}
		out = append(out, f)
	}
	return out, nil
}

func newBenchReportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "report DIR",
		Short: "Print the tables of a finished (or interrupted) bench compare and redraw its plots",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rows, err := measure.ReadResults(filepath.Join(args[0], "results.json"))
			if err != nil {
				return fmt.Errorf("read results: %w", err)
			}
			if _, err := measure.WritePlots(args[0], rows); err != nil {
				return err
			}
			measure.WriteCompareMarkdown(os.Stdout, rows, measure.CompareConfig{})
			return nil
		},
	}
}

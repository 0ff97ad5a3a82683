package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/bench"
	"github.com/deptrace/deptrace/internal/bundler"
	"github.com/deptrace/deptrace/internal/loadgen"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Load generator and overhead benchmarks"}
	cmd.AddCommand(newBenchLoadCmd(), newBenchServeCmd(), newBenchOverheadCmd())
	return cmd
}

func newBenchLoadCmd() *cobra.Command {
	var (
		cfg     loadgen.Config
		addrs   []string
		serve   string
		ports   int
		clients int
		format  string
	)
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Drive a TCP/UDP echo load, paced or as fast as it goes",
		Long: `load runs echo clients against --addr servers (or against its own, with
--serve) and reports the achieved rate, errors, latency percentiles and the
ground truth: every client-server edge that completed a round trip. With
--rate the clients are paced; a rate they cannot reach is reported as
reached=false, never silently. --clients N spreads client source addresses
over N loopback addresses (127.1.0.1...) to emulate N client hosts; --ports N
makes --serve listen on N consecutive ports to emulate N services.`,
		Example: `  deptrace bench load --serve 127.0.0.1:0 --workload tcp-short --duration 10s
  deptrace bench load --serve 127.0.0.1:20000 --ports 100 --clients 1000 --rate 10000 --workload udp
  deptrace bench load --addr 127.0.0.1:7000 --workload tcp-persistent --concurrency 100 --rate 5000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return fmt.Errorf("invalid --output %q: allowed table, json", format)
			}
			var err error
			if cfg.Sources, err = loadgen.Sources(clients); err != nil {
				return fmt.Errorf("--%s", strings.TrimPrefix(err.Error(), "invalid "))
			}
			cfg.Addrs = addrs
			if serve != "" {
				bound, err := loadgen.Serve(cmd.Context(), serve, ports)
				if err != nil {
					return err
				}
				cfg.Addrs = append(cfg.Addrs, bound...)
			}
			if len(cfg.Addrs) == 0 {
				return fmt.Errorf("missing --addr (server host:port) or --serve (start echo servers here)")
			}
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("--%s", strings.TrimPrefix(err.Error(), "invalid "))
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
			fmt.Printf("%s: %d round trips in %s = %.0f/s (%s), %d errors, %d edges, p50 %s p90 %s p99 %s\n",
				r.Workload, r.RoundTrips, r.Elapsed.Round(time.Millisecond), r.Rate, target, r.Errors, len(r.Edges), r.P50, r.P90, r.P99)
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.Workload, "workload", loadgen.TCPShort, "workload: "+strings.Join(loadgen.Workloads, ", "))
	cmd.Flags().StringSliceVar(&addrs, "addr", nil, "echo server addresses host:port (comma list)")
	cmd.Flags().StringVar(&serve, "serve", "", "start echo servers here: first address ip:port (port 0 picks one)")
	cmd.Flags().IntVar(&ports, "ports", 1, "with --serve: listen on this many consecutive ports (emulated services)")
	cmd.Flags().IntVar(&clients, "clients", 0, "emulated client hosts: source addresses 127.1.0.1 onwards (0: kernel's choice)")
	cmd.Flags().IntVar(&cfg.Concurrency, "concurrency", 8, "parallel clients, or connections held open (1 to 10000)")
	cmd.Flags().Float64Var(&cfg.Rate, "rate", 0, "target round trips (tcp-short: connections) per second over all clients; 0 = as fast as possible")
	cmd.Flags().IntVar(&cfg.MsgSize, "msg-size", 64, "bytes per request and response (1 to 65000)")
	cmd.Flags().DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to drive the load")
	cmd.Flags().StringVarP(&format, "output", "o", "table", "table or json")
	return cmd
}

func newBenchServeCmd() *cobra.Command {
	var (
		addr  string
		ports int
	)
	cmd := &cobra.Command{
		Use:     "serve",
		Short:   "Run TCP and UDP echo servers until interrupted",
		Example: `  deptrace bench serve --addr 127.0.0.1:20000 --ports 1000`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			bound, err := loadgen.Serve(ctx, addr, ports)
			if err != nil {
				return err
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
	return cmd
}

func newBenchOverheadCmd() *cobra.Command {
	cfg := bench.OverheadConfig{}
	var workloads string
	cmd := &cobra.Command{
		Use:   "overhead",
		Short: "Measure deptrace's own cost under a loopback load (root)",
		Long: `overhead runs each workload four times in its own process: without deptrace,
with the tracer attached (agent CPU; bpf_stats off), with bpf_stats on (run time
of every kernel program), and without deptrace again (the noise floor). It
prints Markdown tables for docs/performance.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bundler.CheckCapabilities(); err != nil {
				return err
			}
			if cfg.Duration < time.Second || cfg.Duration > time.Hour {
				return fmt.Errorf("invalid --duration %s: allowed 1s to 1h", cfg.Duration)
			}
			cfg.Workloads = strings.Split(workloads, ",")
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
			cfg.LoadCommand = []string{self, "bench", "load"}
			ms, err := bench.Overhead(cmd.Context(), cfg, os.Stderr)
			if err != nil {
				return err
			}
			bench.WriteMarkdown(os.Stdout, ms, cfg)
			return nil
		},
	}
	cmd.Flags().DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of each phase (1s to 1h)")
	cmd.Flags().IntVar(&cfg.Concurrency, "concurrency", 8, "clients (short-lived) and connections (persistent)")
	cmd.Flags().IntVar(&cfg.MsgSize, "msg-size", 64, "bytes per request and response")
	cmd.Flags().StringVar(&workloads, "workloads", loadgen.TCPShort+","+loadgen.TCPPersistent+","+loadgen.UDP, "comma list of workloads")
	return cmd
}

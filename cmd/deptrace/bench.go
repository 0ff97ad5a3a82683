package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/bench"
	"github.com/deptrace/deptrace/internal/bundler"
	"github.com/deptrace/deptrace/internal/loadgen"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Load generator and overhead benchmarks"}
	cmd.AddCommand(newBenchLoadCmd(), newBenchOverheadCmd())
	return cmd
}

func newBenchLoadCmd() *cobra.Command {
	var (
		cfg    loadgen.Config
		serve  string
		format string
	)
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Drive a TCP/UDP echo load (closed loop, as fast as it goes)",
		Example: `  deptrace bench load --serve 127.0.0.1:0 --workload tcp-short --duration 10s
  deptrace bench load --addr 127.0.0.1:7000 --workload udp --concurrency 4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "table" && format != "json" {
				return fmt.Errorf("invalid --output %q: allowed table, json", format)
			}
			if serve != "" {
				addr, err := loadgen.Serve(cmd.Context(), serve)
				if err != nil {
					return err
				}
				cfg.Addr = addr
			}
			if cfg.Addr == "" {
				return fmt.Errorf("missing --addr (server host:port) or --serve (start an echo server here)")
			}
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("--%s", strings.Replace(err.Error(), "invalid ", "", 1))
			}
			r, err := loadgen.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if format == "json" {
				return json.NewEncoder(os.Stdout).Encode(r)
			}
			fmt.Printf("%s: %d round trips in %s = %.0f/s, %d errors, p50 %s p90 %s p99 %s\n",
				r.Workload, r.RoundTrips, r.Elapsed.Round(time.Millisecond), r.Rate, r.Errors, r.P50, r.P90, r.P99)
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.Workload, "workload", loadgen.TCPShort, "workload: "+strings.Join(loadgen.Workloads, ", "))
	cmd.Flags().StringVar(&cfg.Addr, "addr", "", "echo server address host:port")
	cmd.Flags().StringVar(&serve, "serve", "", "start an echo server on this address (port 0 picks one) and load it")
	cmd.Flags().IntVar(&cfg.Concurrency, "concurrency", 8, "parallel clients, or connections held open (1 to 10000)")
	cmd.Flags().IntVar(&cfg.MsgSize, "msg-size", 64, "bytes per request and response (1 to 65000)")
	cmd.Flags().DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to drive the load")
	cmd.Flags().StringVarP(&format, "output", "o", "table", "table or json")
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
			probe := loadgen.Config{Workload: "", Concurrency: cfg.Concurrency, MsgSize: cfg.MsgSize, Duration: cfg.Duration}
			for _, w := range cfg.Workloads {
				probe.Workload = w
				if err := probe.Validate(); err != nil {
					return fmt.Errorf("--%s", strings.Replace(err.Error(), "invalid ", "", 1))
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

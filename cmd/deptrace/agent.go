package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/agent"
	"github.com/deptrace/deptrace/internal/metrics"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

func newAgentCmd() *cobra.Command {
	var (
		tf        tracerFlags
		cfg       agent.Config
		interval  time.Duration
		retention string
		spoolMax  int64
		pinPath   string
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Trace continuously and write the dependency graph's history into a store",
		Long: `agent runs the tracer and writes every interval's bundled flows into a store:
by default an SQLite file at ` + store.DefaultPath + `, created on first run;
with --store postgres://... a PostgreSQL database that many agents on many hosts
share. While the store is unreachable the agent keeps tracing and spools
batches to disk (bounded by --spool-max), retrying every 5 s.

It serves Prometheus metrics at http://` + metrics.DefaultListen + `/metrics
(--metrics-listen; "" turns them off): one counter per dependency, listener
and loss cause, and the agent's own health. See docs/metrics.md.

The kernel side is pinned under --pin-path: if the agent is killed, it keeps
counting, and the next agent adopts it and reports what was counted
meanwhile. An interval's counts are reset in the kernel only once the store
(or the spool) holds them; one the killed agent had not stored is read again
under the same batch id, which the store applies once. A clean stop
(SIGTERM) detaches it unless --keep-tracing; deptrace cleanup removes one a
killed agent left.`,
		Example: `  deptrace agent
  deptrace agent --store postgres://deptrace@db.example/deptrace --netns self --retention 30d`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tcfg, err := tf.config()
			if err != nil {
				return err
			}
			if interval < time.Second || interval > time.Hour {
				return fmt.Errorf("invalid --interval %s: allowed 1s to 1h", interval)
			}
			tcfg.Interval = interval
			if pinPath != "" && !filepath.IsAbs(pinPath) {
				return fmt.Errorf("invalid --pin-path %q: allowed an absolute path on bpffs (default %s) or \"\" for no pinning", pinPath, tracer.DefaultPinPath)
			}
			if cfg.KeepTracing && pinPath == "" {
				return fmt.Errorf("invalid --keep-tracing with --pin-path \"\": only a pinned kernel side can be kept")
			}
			tcfg.PinPath = pinPath
			cfg.Tracer = tcfg
			if cfg.Retention, err = parseRetention(retention); err != nil {
				return err
			}
			if spoolMax < 1<<20 {
				return fmt.Errorf("invalid --spool-max %d: allowed 1048576 (1 MiB) or more", spoolMax)
			}
			cfg.SpoolMax = spoolMax
			if err := metrics.CheckListen(cfg.MetricsListen); err != nil {
				return err
			}
			if cfg.Metrics.TTL < metrics.MinTTL {
				return fmt.Errorf("invalid --metrics-ttl %s: allowed %s or more", cfg.Metrics.TTL, metrics.MinTTL)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return agent.Run(ctx, cfg, slog.With("component", "agent"))
		},
	}
	tf.register(cmd)
	cmd.Flags().StringVar(&cfg.Store, "store", store.DefaultPath, "SQLite file path, or postgres://user@host/db")
	cmd.Flags().DurationVar(&interval, "interval", 5*time.Second, "time between two drains and store writes (1s to 1h)")
	cmd.Flags().StringVar(&retention, "retention", "0", "delete buckets older than this (e.g. 30d, 12h); 0 keeps everything")
	cmd.Flags().StringVar(&cfg.SpoolPath, "spool", agent.DefaultSpoolPath, "where batches wait while the store is unreachable")
	cmd.Flags().Int64Var(&spoolMax, "spool-max", 256<<20, "most bytes the spool may hold")
	cmd.Flags().StringVar(&cfg.HostID, "host-id", "", "id of this machine's root namespace (default: hostname)")
	cmd.Flags().StringVar(&cfg.MetricsListen, "metrics-listen", metrics.DefaultListen, "host:port serving Prometheus /metrics; \"\" disables them")
	cmd.Flags().DurationVar(&cfg.Metrics.TTL, "metrics-ttl", metrics.DefaultTTL, "drop a metric series idle for longer than this (1s or more)")
	cmd.Flags().StringVar(&pinPath, "pin-path", tracer.DefaultPinPath, "bpffs directory where the kernel side is pinned, so it keeps counting if the agent dies; \"\" disables pinning")
	cmd.Flags().BoolVar(&cfg.KeepTracing, "keep-tracing", false, "on a clean stop, leave the pinned kernel side attached and counting for the next agent")
	cmd.Flags().BoolVar(&cfg.Metrics.ClientAddr, "metrics-client-addr", false, "label inbound series with the client address (unbounded: only for few clients)")
	return cmd
}

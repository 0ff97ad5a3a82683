package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/agent"
	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/identity"
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
		perLevel  [3]string // --retention-minutes, -hours, -days
		maxSize   string
		bufferMax string
		spoolMax  string
		pinPath   string
		idf       identityFlags
		df        dnsFlags
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Trace continuously and write the dependency graph's history into a store",
		Long: `agent runs the tracer and writes every interval's bundled flows into a store:
by default an SQLite file at ` + store.DefaultPath + `, created on first run;
with --store postgres://... a PostgreSQL database that many agents on many hosts
share. While the store is unreachable the agent keeps tracing and spools
batches to disk (bounded by --spool-max), retrying every 5 s. While neither
the store nor the spool can be written (a full disk), a pinned kernel side
keeps the interval and counts on; without one (--pin-path "") the newest
batches wait in memory (bounded by --buffer-max). Both are written once
space returns.

History is bounded by resolution: minute buckets are kept for
--retention-minutes, hour buckets for --retention-hours, day buckets for
--retention-days (0 keeps a level for ever); queries over older ranges are
answered from the coarser levels. Past --store-max-size the oldest buckets
are deleted first. See docs/operations.md, "Disk use and retention".

Local ends in a systemd unit, a container or a Kubernetes pod are named by
it (from the cgroup and the runtime's own API), in the store, the graph and
the metrics; --no-identity turns this off. See docs/flows.md.

Outbound flows to an address a DNS answer gave are stored with the name asked
for, and each client's lookups (answers by code, timeouts, latency) per
resolver; --no-dns turns both off.

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
  deptrace agent --store postgres://deptrace@db.example/deptrace --netns self \
      --retention-minutes 24h --retention-hours 14d --retention-days 400d --store-max-size 50GiB`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tcfg, err := tf.config()
			if err != nil {
				return err
			}
			if err := store.CheckSpec(cfg.Store); err != nil {
				return err
			}
			if interval < time.Second || interval > time.Hour {
				return fmt.Errorf("invalid --interval %s: allowed %s", cli.FormatDuration(interval), agentIntervals)
			}
			tcfg.Interval = interval
			if pinPath != "" {
				if err := tracer.CheckPinPath(pinPath); err != nil {
					return fmt.Errorf("invalid --pin-path %q: %w: allowed a directory on bpffs such as %s (the default), or \"\" for no pinning", pinPath, err, tracer.DefaultPinPath)
				}
				pinPath = filepath.Clean(pinPath)
			}
			if cfg.KeepTracing && pinPath == "" {
				return fmt.Errorf("invalid --keep-tracing with --pin-path \"\": only a pinned kernel side can be kept")
			}
			tcfg.PinPath = pinPath
			cfg.Tracer = tcfg
			if cfg.Retention, err = agentRetention(cmd, retention, perLevel); err != nil {
				return err
			}
			if cfg.StoreMaxSize, err = parseBytes("--store-max-size", maxSize, 16<<20, 1<<50, "0 (no ceiling) or"); err != nil {
				return err
			}
			if cfg.BufferMax, err = parseBytes("--buffer-max", bufferMax, 0, 64<<30, ""); err != nil {
				return err
			}
			if cfg.SpoolMax, err = parseBytes("--spool-max", spoolMax, 1<<20, 1<<50, ""); err != nil {
				return err
			}
			if err := agent.CheckHostID(cfg.HostID); err != nil {
				return fmt.Errorf("invalid --host-id %q: %w", cfg.HostID, err)
			}
			if cfg.MaxProcs < 0 {
				return fmt.Errorf("invalid --gomaxprocs %d: allowed %s", cfg.MaxProcs, maxProcsAllowed)
			}
			if err := metrics.CheckListen(cfg.MetricsListen); err != nil {
				return err
			}
			if cfg.Metrics.MaxIdentityValues < 1 {
				return fmt.Errorf("invalid --metrics-identity-max %d: allowed %s", cfg.Metrics.MaxIdentityValues, identityMaxAllowed)
			}
			if cfg.Metrics.TTL < metrics.MinTTL {
				return fmt.Errorf("invalid --metrics-ttl %s: allowed %s", cli.FormatDuration(cfg.Metrics.TTL), metricsTTLAllowed)
			}
			idCfg, err := idf.config()
			if err != nil {
				return err
			}
			dnsCfg, err := df.config(tcfg.NetNS)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), cli.StopSignals()...)
			defer stop()
			log := slog.With("component", "agent")
			// The resolver starts before the tracer, as in trace: it
			// learns cgroups and containers as they appear, so that one
			// gone by the first drain is still named.
			var names *identity.Resolver
			if idCfg != nil {
				if names, err = identity.New(*idCfg); err != nil {
					log.Warn("local ends will not be named by unit or container", "err", err)
				} else {
					defer func() { _ = names.Close() }() // stops watching; nothing to report at exit
					cfg.Annotate = names.Annotate
				}
			}
			if dnsCfg != nil {
				// The watcher starts once the tracer is loaded, whose send
				// and receive programs hand it DNS calls.
				var dns *dnswatch.Watcher
				var losses dnsLosses
				cfg.Loaded = func(t *tracer.Tracer) (stop func()) {
					if dns = startDNS(dnsCfg, t, log); dns == nil {
						return nil
					}
					return func() { _ = dns.Close() } // detaches; nothing to report at exit
				}
				cfg.DNS = func(iv *tracer.Interval) {
					if dns == nil {
						return
					}
					dns.Apply(iv)
					losses.warn(dns.Stats(), log)
					if names != nil { // identity on: name the DNS clients too
						for i := range iv.DNS {
							iv.DNS[i].Identity = names.Resolve(iv.DNS[i].CgroupID)
						}
					}
				}
			}
			return agent.Run(ctx, cfg, log)
		},
	}
	tf.register(cmd)
	cmd.Flags().StringVar(&cfg.Store, "store", store.DefaultPath, "SQLite file path, or postgres://user@host/db")
	cmd.Flags().DurationVar(&interval, "interval", 5*time.Second, "time between two drains and store writes (1s to 1h)")
	def := store.DefaultRetention
	for i, l := range retentionLevels {
		cmd.Flags().StringVar(&perLevel[i], "retention-"+l.name, formatAge(l.of(def)), retentionHelp(l.bucket, l.example, l.name))
	}
	cmd.Flags().StringVar(&retention, "retention", "", "one window for every level instead of --retention-minutes, --retention-hours and --retention-days (e.g. 30d); 0 keeps everything")
	cmd.Flags().StringVar(&maxSize, "store-max-size", formatBytes(agent.DefaultStoreMaxSize), "past this size (e.g. 500MiB, 20GB) the store's oldest buckets are deleted first; 0: no ceiling")
	cmd.Flags().StringVar(&bufferMax, "buffer-max", formatBytes(agent.DefaultBufferMax), "without a pinned kernel side, most memory (estimated) for the newest batches while neither the store nor the spool can be written; 0 keeps none")
	cmd.Flags().StringVar(&cfg.SpoolPath, "spool", agent.DefaultSpoolPath, "where batches wait while the store is unreachable")
	cmd.Flags().StringVar(&spoolMax, "spool-max", formatBytes(256<<20), "most the spool may hold while the store is unreachable (e.g. 256MiB, 1GB; 1MiB or more)")
	cmd.Flags().IntVar(&cfg.MaxProcs, "gomaxprocs", agent.DefaultMaxProcs, "threads running the agent's Go code at once (Go's GOMAXPROCS, which wins when set); 0: Go's default (one per CPU or the container's CPU limit)")
	cmd.Flags().StringVar(&cfg.HostID, "host-id", "", "id of this machine's root namespace (default: hostname)")
	cmd.Flags().StringVar(&cfg.MetricsListen, "metrics-listen", metrics.DefaultListen, "host:port serving Prometheus /metrics; \"\" disables them")
	cmd.Flags().DurationVar(&cfg.Metrics.TTL, "metrics-ttl", metrics.DefaultTTL, "drop a metric series idle for longer than this (1s or more)")
	cmd.Flags().StringVar(&pinPath, "pin-path", tracer.DefaultPinPath, "bpffs directory where the kernel side is pinned, so it keeps counting if the agent dies; \"\" disables pinning")
	cmd.Flags().BoolVar(&cfg.KeepTracing, "keep-tracing", false, "on a clean stop, leave the pinned kernel side attached and counting for the next agent")
	cmd.Flags().BoolVar(&cfg.Metrics.ClientAddr, "metrics-client-addr", false, "label inbound series with the client address (unbounded: only for few clients)")
	cmd.Flags().BoolVar(&cfg.Metrics.Identity, "metrics-identity", false, "label dependency series with the local end's workload and container name (never ids); off by default: it changes every series' labels")
	cmd.Flags().IntVar(&cfg.Metrics.MaxIdentityValues, "metrics-identity-max", metrics.DefaultMaxIdentityValues, "with --metrics-identity, most distinct (workload, container) pairs; past it new ones read _other (1 or more)")
	cmd.Flags().BoolVar(&cfg.Metrics.RemoteNames, "metrics-remote-names", false, "label outbound series with the server's DNS name (remote_name); off by default: names are many and an address's name changes")
	cmd.Flags().Var(agent.IntFlag(&cfg.Metrics.MaxRemoteNames, metrics.DefaultMaxRemoteNames, 1, 1<<20, ""), "metrics-remote-names-max", "with --metrics-remote-names, most distinct names; past it new ones read _other")
	cmd.Flags().Var(agent.IntFlag(&cfg.MaxEdgesPerNode, agent.DefaultMaxEdgesPerNode, 1, agent.MaxEdgesPerNodeLimit, "no cap"), "max-edges-per-node", "most distinct edges (peers) one local process keeps in the store and the metrics; past it its new peers' flows are added to one edge to _other (docs/operations.md)")
	cmd.Flags().Var(agent.IntFlag(&cfg.Metrics.MaxSeries, metrics.DefaultMaxSeries, 1, 1<<24, ""), "metrics-max-series", "most dependency and listener series held; past it a new dependency counts in its direction and protocol's _other series (and in deptrace_metrics_series_dropped_total)")
	idf.register(cmd)
	df.register(cmd)
	cli.SetAllowed(cmd.Flags(), "interval", agentIntervals)
	cli.SetAllowed(cmd.Flags(), "gomaxprocs", maxProcsAllowed)
	cli.SetAllowed(cmd.Flags(), "metrics-identity-max", identityMaxAllowed)
	cli.SetAllowed(cmd.Flags(), "metrics-ttl", metricsTTLAllowed)
	return cmd
}

// What the agent's numeric flags take where their type takes more: in
// the error of a value that does not parse, and of one out of range.
var (
	agentIntervals     = "1s to 1h"
	maxProcsAllowed    = "0 (Go's default) or more"
	identityMaxAllowed = "1 or more"
	metricsTTLAllowed  = cli.FormatDuration(metrics.MinTTL) + " or more"
)

// retentionLevels are the agent's per-level retention flags, finest first.
var retentionLevels = []struct {
	name, bucket, example string
	of                    func(store.Retention) time.Duration
}{
	{"minutes", "minute", "48h, 2d", func(r store.Retention) time.Duration { return r.Minutes }},
	{"hours", "hour", "30d", func(r store.Retention) time.Duration { return r.Hours }},
	{"days", "day", "400d", func(r store.Retention) time.Duration { return r.Days }},
}

func retentionHelp(bucket, example, level string) string {
	h := fmt.Sprintf("keep %s buckets this long (e.g. %s); 0 keeps them for ever", bucket, example)
	if level != "days" {
		h += "; no longer than a coarser level's"
	}
	return h
}

// agentRetention reads --retention-minutes, --retention-hours and
// --retention-days, or the older --retention (one window for every level).
func agentRetention(cmd *cobra.Command, legacy string, perLevel [3]string) (store.Retention, error) {
	if legacy != "" {
		for _, l := range retentionLevels {
			if cmd.Flags().Changed("retention-" + l.name) {
				return store.Retention{}, fmt.Errorf("invalid --retention with --retention-%s: --retention sets every level at once; give either it or --retention-minutes, --retention-hours and --retention-days", l.name)
			}
		}
		d, err := parseRetention(legacy)
		if err != nil {
			return store.Retention{}, fmt.Errorf("%w; or one per level: --retention-minutes, --retention-hours, --retention-days", err)
		}
		return store.Retention{Minutes: d, Hours: d, Days: d}, nil
	}
	var ds [3]time.Duration
	for i, l := range retentionLevels {
		d, err := cli.ParseAge(perLevel[i])
		if err != nil || d != 0 && d < time.Hour {
			return store.Retention{}, fmt.Errorf("invalid --retention-%s %q: allowed 0 (keep for ever) or at least 1h, e.g. %s", l.name, perLevel[i], l.example)
		}
		ds[i] = d
	}
	r := store.Retention{Minutes: ds[0], Hours: ds[1], Days: ds[2]}
	// A level left at its default is named so: the user who shortened
	// --retention-hours to 2h never typed --retention-minutes 48h.
	named := func(i int) string {
		text := "--retention-" + retentionLevels[i].name + " " + perLevel[i]
		if ds[i] == 0 {
			text += " (for ever)"
		}
		if !cmd.Flags().Changed("retention-" + retentionLevels[i].name) {
			text += " (its default)"
		}
		return text
	}
	for i := range 2 {
		for j := i + 1; j < 3; j++ {
			if ds[i] == 0 && ds[j] != 0 || ds[i] != 0 && ds[j] != 0 && ds[j] < ds[i] {
				return r, fmt.Errorf("invalid %s: longer than %s; allowed at most each coarser level's window: set --retention-%s to %s or less",
					named(i), named(j), retentionLevels[i].name, perLevel[j])
			}
		}
	}
	return r, r.Check()
}

// formatAge writes a duration as the retention flags read it: whole
// days from 3 on as "Nd" (cli.ParseAge takes them), the rest as any
// duration flag's (cli.FormatDuration).
func formatAge(d time.Duration) string {
	if d != 0 && d%(24*time.Hour) == 0 && d >= 72*time.Hour {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return cli.FormatDuration(d)
}

// byteUnits are the units parseBytes reads: powers of 1024 and of 1000.
var byteUnits = []struct {
	suffix string
	mult   int64
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}

// parseBytes reads a size: a number of bytes, or a number with one of
// byteUnits (4GiB, 500MB, 1.5GiB); 0, or from lo to hi. zero names what
// 0 means (empty: 0 is simply the lower bound).
func parseBytes(flag, v string, lo, hi int64, zero string) (int64, error) {
	bad := func() error {
		allowed := fmt.Sprintf("%s from %s to %s", zero, formatBytes(lo), formatBytes(hi))
		if zero == "" {
			allowed = fmt.Sprintf("from %s to %s", formatBytes(lo), formatBytes(hi))
		}
		return fmt.Errorf("invalid %s %q: allowed %s, as bytes or with a unit (KiB, MiB, GiB, TiB, kB, MB, GB, TB), e.g. 4GiB", flag, v, strings.TrimSpace(allowed))
	}
	num, mult := strings.TrimSpace(v), int64(1)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	// NaN and infinities parse, and compare false with every bound.
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f*float64(mult) > float64(hi) {
		return 0, bad()
	}
	n := int64(f * float64(mult))
	if n == 0 && zero != "" {
		return 0, nil
	}
	if n < lo {
		return 0, bad()
	}
	return n, nil
}

// formatBytes writes n in the largest binary unit that divides it.
func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

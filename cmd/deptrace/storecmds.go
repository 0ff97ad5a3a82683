package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/store"
)

// parseRetention accepts Go durations plus a "d" (day) suffix.
func parseRetention(v string) (time.Duration, error) {
	if v == "" || v == "0" {
		return 0, nil
	}
	d, err := parseDays(v)
	if err != nil || d < time.Hour {
		return 0, fmt.Errorf("invalid --retention %q: allowed 0 (keep all) or at least 1h, e.g. 12h, 30d", v)
	}
	return d, nil
}

func parseDays(v string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(v, "d"); ok {
		var days float64
		if _, err := fmt.Sscanf(n, "%g", &days); err != nil || days < 0 {
			return 0, fmt.Errorf("bad days %q", v)
		}
		return time.Duration(days * float64(24*time.Hour)), nil
	}
	return time.ParseDuration(v)
}

// parseTime reads --since/--until and friends with the parser the web API
// shares (cli.ParseTime), naming the flag in its error.
func parseTime(flag, v string, now time.Time) (time.Time, error) {
	t, err := cli.ParseTime(v, now)
	if err != nil {
		return time.Time{}, fmt.Errorf("invalid --%s %q: %v", flag, v, err)
	}
	return t, nil
}

// healthFlags are the thresholds that make an edge, a service or a
// client's lookups unhealthy (look, graph, diff and serve).
type healthFlags struct {
	h   graph.Health
	dns graph.DNSHealth
}

func (f *healthFlags) register(cmd *cobra.Command) {
	d, dd := graph.DefaultHealth, graph.DefaultDNSHealth
	cmd.Flags().Uint64Var(&f.h.MinEvents, "health-min-events", d.MinEvents, "fewest failed connections, resets or retransmits that can make an edge unhealthy")
	cmd.Flags().Float64Var(&f.h.FailedRatio, "health-failed-ratio", d.FailedRatio, "failed connections over attempts that make an edge unhealthy (0 to 1)")
	cmd.Flags().Float64Var(&f.h.ResetRatio, "health-reset-ratio", d.ResetRatio, "resets over connections that make an edge unhealthy (0 to 1)")
	cmd.Flags().Float64Var(&f.h.RetransmitsPerConn, "health-retransmits-per-conn", d.RetransmitsPerConn, "retransmitted segments per connection above which an edge is unhealthy")
	cmd.Flags().Float64Var(&f.h.ListenDropRatio, "health-listen-drop-ratio", d.ListenDropRatio, "handshake packets a full accept queue dropped (retries counted again) over the arrivals (connections established + drops) that make a service unhealthy (0 to 1)")
	cmd.Flags().Float64Var(&f.h.DegradedFactor, "health-degraded-factor", d.DegradedFactor, "fraction of each threshold from which an edge, service or client's lookups are degraded (over 0, up to 1)")
	cmd.Flags().Float64Var(&f.dns.ErrorRatio, "health-dns-error-ratio", dd.ErrorRatio, "failed lookups (SERVFAIL, other error codes, no answer in time) over queries that make a client's lookups through a resolver unhealthy (0 to 1)")
	cmd.Flags().Uint64Var(&f.dns.MinEvents, "health-dns-min-events", dd.MinEvents, "fewest failed lookups, or NXDOMAIN answers with no address answered, that can make a client's lookups unhealthy (1 to 1000000)")
	// As graph.Health.Validate and graph.DNSHealth.Validate say, for a
	// value that does not parse.
	for name, allowed := range map[string]string{
		"health-min-events": "1 to 1000000", "health-failed-ratio": "0 to 1", "health-reset-ratio": "0 to 1",
		"health-retransmits-per-conn": "0 to 1000", "health-listen-drop-ratio": "0 to 1", "health-degraded-factor": "more than 0, up to 1",
		"health-dns-error-ratio": "0 to 1", "health-dns-min-events": "1 to 1000000",
	} {
		cli.SetAllowed(cmd.Flags(), name, allowed)
	}
}

// depths is what --depth takes (look, graph).
const depths = "0 (unlimited) or more"

// validate checks every threshold, naming the flag out of range, and
// gives the DNS thresholds the edges' degraded factor.
func (f *healthFlags) validate() error {
	if err := f.h.Validate(); err != nil {
		return err
	}
	f.dns.DegradedFactor = f.h.DegradedFactor
	return f.dns.Validate()
}

// queryFlags are shared by look, graph and diff.
type queryFlags struct {
	store        string
	since, until string
	groupBy      string
	health       healthFlags
}

func (q *queryFlags) register(cmd *cobra.Command) {
	q.health.register(cmd)
	cmd.Flags().StringVar(&q.groupBy, "group-by", graph.ByWorkload, "what a node is: "+strings.Join(graph.GroupBys, ", ")+" (a workload is a process, or its container, pod or systemd service)")
	cmd.Flags().StringVar(&q.store, "store", store.DefaultPath, "SQLite file path, or postgres://user@host/db")
	cmd.Flags().StringVar(&q.since, "since", "", "only dependencies seen at or after this time (RFC 3339, 15:04, or an age like 1h)")
	cmd.Flags().StringVar(&q.until, "until", "", "only dependencies seen before this time")
}

func (q *queryFlags) rangeAndStore(ctx context.Context) (store.Range, *store.Store, error) {
	now := time.Now()
	since, err := parseTime("since", q.since, now)
	if err != nil {
		return store.Range{}, nil, err
	}
	until, err := parseTime("until", q.until, now)
	if err != nil {
		return store.Range{}, nil, err
	}
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return store.Range{}, nil, fmt.Errorf("invalid range: --since %s is not before --until %s", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	if !strings.Contains(q.store, "://") {
		if _, err := os.Stat(q.store); err != nil {
			return store.Range{}, nil, fmt.Errorf("no store at %s: run deptrace agent first, or pass --store", q.store)
		}
	}
	st, err := store.Open(ctx, q.store)
	if err != nil {
		return store.Range{}, nil, err
	}
	return store.Range{Since: since, Until: until}, st, nil
}

// graph opens the store and builds the graph of the selected range,
// grouped by --group-by.
func (q *queryFlags) graph(ctx context.Context) (graph.Graph, []store.Host, error) {
	g, hosts, err := q.ungrouped(ctx)
	if err != nil {
		return g, hosts, err
	}
	g = graph.Group(g, q.groupBy)
	g.Judge(q.health.h)
	g.JudgeDNS(q.health.dns)
	return g, hosts, nil
}

// ungrouped is the process/service graph of format 1 (graph --format
// json-v1).
func (q *queryFlags) ungrouped(ctx context.Context) (graph.Graph, []store.Host, error) {
	if err := graph.ValidGroupBy(q.groupBy); err != nil {
		return graph.Graph{}, nil, err
	}
	if err := q.health.validate(); err != nil {
		return graph.Graph{}, nil, err
	}
	r, st, err := q.rangeAndStore(ctx)
	if err != nil {
		return graph.Graph{}, nil, err
	}
	defer func() { _ = st.Close() }() // a read-only command
	g, hosts, err := loadGraph(ctx, st, r)
	g.Judge(q.health.h)
	g.JudgeDNS(q.health.dns)
	return g, hosts, err
}

func loadGraph(ctx context.Context, st *store.Store, r store.Range) (graph.Graph, []store.Host, error) {
	return graph.Load(ctx, st, r)
}

func newLookCmd() *cobra.Command {
	var (
		q       queryFlags
		depth   int
		reverse bool
	)
	cmd := &cobra.Command{
		Use:   "look TARGET",
		Short: "Show what TARGET depends on and what depends on it",
		Long: `look prints the dependency tree around TARGET, which is a host (id or name),
an address (everything on the host that holds it), address:port (one service),
a unix socket path, what operators call an end (a workload such as
Deployment/checkout or just checkout, a pod, a container's name, a systemd
unit such as nginx.service or nginx), or a process name. Ends in a container,
a pod or a unit are labelled by it. --depth follows dependencies transitively (0: all the way);
a node reached twice is shown once and marked. --reverse shows only what
depends on TARGET, all the way up: the impact of taking it down.
A TARGET that resolved names lists its DNS lookups per resolver under its
line (queries, answers, NXDOMAIN, SERVFAIL, other errors, timeouts, latency
avg/max, health and reasons); [DNS UNHEALTHY] or [DNS DEGRADED] follows any
node whose lookups fail, by the --health-dns-* thresholds.`,
		Example: `  deptrace look postgres
  deptrace look 10.0.1.10:5432 --reverse
  deptrace look web-1 --depth 3 --since 1h
  deptrace look checkout --reverse`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if depth < 0 {
				return fmt.Errorf("invalid --depth %d: allowed %s", depth, depths)
			}
			if reverse && !cmd.Flags().Changed("depth") {
				depth = 0
			}
			g, hosts, err := q.graph(cmd.Context())
			if err != nil {
				return err
			}
			roots, err := graph.Resolve(g, hosts, args[0])
			if err != nil {
				return err
			}
			trees := graph.Look(g, roots, depth, !reverse, true, graph.TargetPort(args[0]))
			graph.WriteTrees(os.Stdout, trees, !reverse, true)
			return nil
		},
	}
	q.register(cmd)
	cmd.Flags().IntVar(&depth, "depth", 1, "levels to follow (0: unlimited)")
	cli.SetAllowed(cmd.Flags(), "depth", depths)
	cmd.Flags().BoolVar(&reverse, "reverse", false, "only what depends on TARGET, transitively (impact analysis)")
	return cmd
}

func newGraphCmd() *cobra.Command {
	var (
		q      queryFlags
		format string
		target string
		depth  int
	)
	cmd := &cobra.Command{
		Use:   "graph",
		Short: "Export the dependency graph as JSON, DOT or Mermaid",
		Long: `graph prints the dependency graph of the range: one node per workload on a
host (--group-by workload: a process, or the container, pod or systemd service
it runs in; process; or host), carrying the services it listens on, and one
edge per client, server, protocol and port. --format json is format 2
("format": 2); --format json-v1 is the process/service graph of format 1,
deprecated and kept for one release.`,
		Example: `  deptrace graph --format json
  deptrace graph --format dot --since 24h | dot -Tsvg > deps.svg
  deptrace graph --format mermaid --target postgres --depth 2`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains(graph.Formats, format) {
				return fmt.Errorf("invalid --format %q: allowed %s", format, strings.Join(graph.Formats, ", "))
			}
			if depth < 0 {
				return fmt.Errorf("invalid --depth %d: allowed %s", depth, depths)
			}
			load := q.graph
			if format == "json-v1" {
				if cmd.Flags().Changed("group-by") {
					return fmt.Errorf("invalid --group-by %q with --format json-v1: format 1 is the process and service graph, never grouped; allowed --group-by with --format json, dot or mermaid", q.groupBy)
				}
				load = q.ungrouped
			}
			g, hosts, err := load(cmd.Context())
			if err != nil {
				return err
			}
			if target != "" {
				roots, err := graph.Resolve(g, hosts, target)
				if err != nil {
					return err
				}
				g = graph.Reachable(g, roots, depth, graph.TargetPort(target))
			}
			return graph.Write(os.Stdout, g, format)
		},
	}
	q.register(cmd)
	cmd.Flags().StringVar(&format, "format", "json", "output format: "+strings.Join(graph.Formats, ", "))
	cmd.Flags().StringVar(&target, "target", "", "only the part of the graph around this host, address, address:port or process")
	cmd.Flags().IntVar(&depth, "depth", 0, "with --target: levels to follow (0: unlimited)")
	cli.SetAllowed(cmd.Flags(), "depth", depths)
	return cmd
}

func newDiffCmd() *cobra.Command {
	var q queryFlags
	var beforeSince, beforeUntil string
	cmd := &cobra.Command{
		Use:   "diff --since A --until B",
		Short: "Edges that appeared or disappeared",
		Long: `diff compares the edges seen in [--since, --until) with those seen in the window
of the same length just before it (or [--before-since, --before-until)), and
prints "+" for each edge that appeared and "-" for each that disappeared.
With only --before-since, the earlier window ends at --since; with only
--before-until, it is as long as [--since, --until).`,
		Example: `  deptrace diff --since 1h                      # last hour against the hour before
  deptrace diff --since 2026-11-20 --until 2026-11-21`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if q.since == "" {
				return fmt.Errorf("missing --since: diff compares [--since, --until) with the window before it")
			}
			if err := graph.ValidGroupBy(q.groupBy); err != nil {
				return err
			}
			if err := q.health.validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			r, st, err := q.rangeAndStore(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = st.Close() }() // a read-only command
			now := time.Now()
			if r.Until.IsZero() {
				r.Until = now
				if !r.Since.Before(r.Until) {
					return fmt.Errorf("invalid --since %s: allowed a time before now (or give --until after it)", r.Since.Format(time.RFC3339))
				}
			}
			// The window before: each end defaulted from the other and
			// the current window as /api/diff does (cli.BeforeWindow).
			var bs, bu time.Time
			if bs, err = parseTime("before-since", beforeSince, now); err != nil {
				return err
			}
			if bu, err = parseTime("before-until", beforeUntil, now); err != nil {
				return err
			}
			before := store.Range{}
			names := cli.WindowNames{Since: "--since", Until: "--until", BeforeSince: "--before-since", BeforeUntil: "--before-until"}
			if before.Since, before.Until, err = cli.BeforeWindow(r.Since, r.Until, bs, bu, names); err != nil {
				return err
			}
			gAfter, _, err := loadGraph(ctx, st, r)
			if err != nil {
				return err
			}
			gBefore, _, err := loadGraph(ctx, st, before)
			if err != nil {
				return err
			}
			gAfter, gBefore = graph.Group(gAfter, q.groupBy), graph.Group(gBefore, q.groupBy)
			gAfter.Judge(q.health.h)
			gBefore.Judge(q.health.h)
			appeared, disappeared := graph.Diff(gBefore, gAfter)
			graph.WriteDiff(os.Stdout, gAfter, appeared, disappeared, gBefore)
			return nil
		},
	}
	q.register(cmd)
	cmd.Flags().StringVar(&beforeSince, "before-since", "", "start of the window to compare against (default: --before-until minus the length of [--since, --until))")
	cmd.Flags().StringVar(&beforeUntil, "before-until", "", "end of the window to compare against (default: --since)")
	return cmd
}

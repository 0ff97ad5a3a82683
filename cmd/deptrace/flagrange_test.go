package main

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/deptrace/deptrace/internal/cli"
)

// Every numeric flag's error says its own range, whether the value does
// not parse as the flag's type ("-1", "99999999999" for a uint32, "x"),
// comes from the environment, or parses and is out of range: never the
// type's ("a whole number", "from 0 to 4294967295").
func TestNumericFlagErrorsSayTheirRange(t *testing.T) {
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"agent", "--max-edges-per-node", "-1"}, `invalid --max-edges-per-node "-1": allowed 0 (no cap) or 1 to 1048576`},
		{nil, []string{"agent", "--max-edges-per-node", "2000000"}, `invalid --max-edges-per-node "2000000": allowed 0 (no cap) or 1 to 1048576`},
		{[]string{"DEPTRACE_MAX_EDGES_PER_NODE=-3"}, []string{"agent"}, `invalid DEPTRACE_MAX_EDGES_PER_NODE="-3" for --max-edges-per-node: allowed 0 (no cap) or 1 to 1048576`},
		{nil, []string{"agent", "--metrics-max-series", "0"}, `invalid --metrics-max-series "0": allowed 1 to 16777216`},
		{nil, []string{"agent", "--metrics-remote-names-max", "0"}, `invalid --metrics-remote-names-max "0": allowed 1 to 1048576`},
		{nil, []string{"agent", "--flow-map-size", "99999999999"}, `invalid --flow-map-size "99999999999": allowed 64 to 4194304`},
		{nil, []string{"agent", "--flow-map-size", "10"}, `invalid --flow-map-size 10: allowed 64 to 4194304`},
		{[]string{"DEPTRACE_FLOW_MAP_SIZE=99999999999"}, []string{"agent"}, `invalid DEPTRACE_FLOW_MAP_SIZE="99999999999" for --flow-map-size: allowed 64 to 4194304`},
		{nil, []string{"agent", "--port-map-size", "-1"}, `invalid --port-map-size "-1": allowed 64 to 1048576`},
		{nil, []string{"agent", "--interval", "soon"}, `invalid --interval "soon": allowed 1s to 1h`},
		{nil, []string{"agent", "--interval", "2h"}, `invalid --interval 2h: allowed 1s to 1h`},
		{nil, []string{"agent", "--gomaxprocs", "all"}, `invalid --gomaxprocs "all": allowed 0 (Go's default) or more`},
		{nil, []string{"agent", "--metrics-identity-max", "99999999999999999999"}, `invalid --metrics-identity-max "99999999999999999999": allowed 1 or more`},
		{nil, []string{"agent", "--metrics-ttl", "long"}, `invalid --metrics-ttl "long": allowed 1s or more`},
		{nil, []string{"agent", "--dns-timeout", "x"}, `invalid --dns-timeout "x": allowed 100ms to 5m`},
		{nil, []string{"agent", "--identity-retain", "x"}, `invalid --identity-retain "x": allowed 1s to 24h`},
		{nil, []string{"agent", "--metrics-listen", "8.8.8.8:99999"}, `invalid --metrics-listen "8.8.8.8:99999": port 99999 is out of range; allowed host:port with a port from 1 to 65535 (0: any free one), e.g. 127.0.0.1:9477, or "" to disable`},
		{nil, []string{"trace", "--interval", "x"}, `invalid --interval "x": allowed 100ms to 1h`},
		{nil, []string{"trace", "--duration", "x"}, `invalid --duration "x": allowed 0 (until interrupted) or more`},
		{nil, []string{"trace", "--flow-map-size", "-1"}, `invalid --flow-map-size "-1": allowed 64 to 4194304`},
		{nil, []string{"doctor", "--sample", "x"}, `invalid --sample "x": allowed 0 to 1m`},
		{nil, []string{"doctor", "--port-map-size", "5000000000"}, `invalid --port-map-size "5000000000": allowed 64 to 1048576`},
		{nil, []string{"look", "--depth", "abc", "x"}, `invalid --depth "abc": allowed 0 (unlimited) or more`},
		{nil, []string{"look", "--depth", "-1", "x"}, `invalid --depth -1: allowed 0 (unlimited) or more`},
		{nil, []string{"look", "--health-min-events", "-1", "x"}, `invalid --health-min-events "-1": allowed 1 to 1000000`},
		{nil, []string{"look", "--health-failed-ratio", "half", "x"}, `invalid --health-failed-ratio "half": allowed 0 to 1`},
		{nil, []string{"graph", "--depth", "x"}, `invalid --depth "x": allowed 0 (unlimited) or more`},
		{nil, []string{"graph", "--health-degraded-factor", "x"}, `invalid --health-degraded-factor "x": allowed more than 0, up to 1`},
		{nil, []string{"diff", "--health-retransmits-per-conn", "x"}, `invalid --health-retransmits-per-conn "x": allowed 0 to 1000`},
		{nil, []string{"diff", "--health-dns-min-events", "99999999999999999999"}, `invalid --health-dns-min-events "99999999999999999999": allowed 1 to 1000000`},
		{nil, []string{"serve", "--cache-mb", "lots"}, `invalid --cache-mb "lots": allowed 0 (no cache) or more`},
		{nil, []string{"serve", "--health-dns-error-ratio", "x"}, `invalid --health-dns-error-ratio "x": allowed 0 to 1`},
		{nil, []string{"serve", "--health-reset-ratio", "x"}, `invalid --health-reset-ratio "x": allowed 0 to 1`},
		{nil, []string{"serve", "--health-listen-drop-ratio", "x"}, `invalid --health-listen-drop-ratio "x": allowed 0 to 1`},
		{[]string{"DEPTRACE_CACHE_MB=-1"}, []string{"serve", "--store", "/nonexistent/x.db"}, `invalid --cache-mb -1: allowed 0 (no cache) or more (set from DEPTRACE_CACHE_MB)`},
	}
	for _, c := range cases {
		stdout, stderr, code := run(t, c.env, c.args...)
		if got := strings.TrimSuffix(stderr, "\n"); code != 1 || stdout != "" || got != "deptrace: "+c.want {
			t.Errorf("%v %v: exit %d, stdout %q, stderr %q;\nwant exit 1 and deptrace: %s", c.env, c.args, code, stdout, stderr, c.want)
		}
	}
}

// A --store no retry can open stops the agent at start, with the line
// look and serve print, before anything is loaded (no log line at all);
// exit status 1.
func TestAgentRefusesAStoreThatCanNeverWork(t *testing.T) {
	const want = `deptrace: invalid --store "mysql://x@y/z": want a file path, sqlite://PATH or postgres://URL`
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"agent", "--store", "mysql://x@y/z", "--pin-path", "", "--metrics-listen", ""}, want},
		{nil, []string{"look", "--store", "mysql://x@y/z", "x"}, want},
		{nil, []string{"serve", "--store", "mysql://x@y/z"}, want},
		{[]string{"DEPTRACE_STORE=mysql://x@y/z"}, []string{"agent", "--pin-path", "", "--metrics-listen", ""}, want + " (set from DEPTRACE_STORE)"},
		{nil, []string{"agent", "--store", "postgres://deptrace:secret@db:5432x/deptrace", "--pin-path", "", "--metrics-listen", ""},
			"deptrace: invalid --store: cannot parse `postgres://deptrace:xxxxx@db:5432x/deptrace`: invalid port; want a file path, sqlite://PATH or postgres://URL"},
	} {
		stdout, stderr, code := run(t, c.env, c.args...)
		if got := strings.TrimSuffix(stderr, "\n"); code != 1 || stdout != "" || got != c.want {
			t.Errorf("%v %v: exit %d, stdout %q, stderr %q;\nwant exit 1 and %s", c.env, c.args, code, stdout, stderr, c.want)
		}
	}
}

// --help writes every duration default as people type it (10m, 1h), not
// as Go does (10m0s, 1h0m0s).
func TestHelpDurationsAsTyped(t *testing.T) {
	seen := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Value.Type() != "duration" {
				return
			}
			seen++
			d, err := time.ParseDuration(f.DefValue)
			if err != nil || f.DefValue != cli.FormatDuration(d) || strings.Contains(f.DefValue, "m0s") || strings.Contains(f.DefValue, "h0m") {
				t.Errorf("%s --%s: default %q in --help, want it as cli.FormatDuration writes it", c.CommandPath(), f.Name, f.DefValue)
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRootCmd())
	if seen == 0 {
		t.Fatal("no duration flag found")
	}
}

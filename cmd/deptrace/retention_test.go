package main

import (
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/store"
)

// Every bad retention, size or buffer value stops the agent with one line
// naming the flag (or its environment variable) and what is allowed,
// before anything is loaded.
func TestAgentRetentionFlagErrors(t *testing.T) {
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"--retention-minutes", "5m"}, `invalid --retention-minutes "5m": allowed 0 (keep for ever) or at least 1h`},
		{nil, []string{"--retention-hours", "soon"}, `invalid --retention-hours "soon": allowed 0 (keep for ever) or at least 1h`},
		{nil, []string{"--retention-minutes", "72h", "--retention-hours", "24h"}, `invalid --retention-minutes 72h: longer than --retention-hours 24h; allowed at most each coarser level's window: set --retention-minutes to 24h or less`},
		{nil, []string{"--retention-minutes", "0"}, `invalid --retention-minutes 0 (for ever): longer than --retention-hours 30d (its default); allowed at most each coarser level's window: set --retention-minutes to 30d or less`},
		{nil, []string{"--retention-hours", "500d"}, `invalid --retention-hours 500d: longer than --retention-days 400d (its default); allowed at most each coarser level's window: set --retention-hours to 400d or less`},
		// A level left at its default is named so: only --retention-hours was typed.
		{nil, []string{"--retention-hours", "2h"}, `invalid --retention-minutes 48h (its default): longer than --retention-hours 2h; allowed at most each coarser level's window: set --retention-minutes to 2h or less`},
		{nil, []string{"--retention", "30d", "--retention-hours", "10d"}, `invalid --retention with --retention-hours: --retention sets every level at once; give either it or --retention-minutes, --retention-hours and --retention-days`},
		{nil, []string{"--retention", "5m"}, `invalid --retention "5m": allowed 0 (keep all) or at least 1h, e.g. 12h, 30d; or one per level: --retention-minutes, --retention-hours, --retention-days`},
		{nil, []string{"--store-max-size", "1MiB"}, `invalid --store-max-size "1MiB": allowed 0 (no ceiling) or from 16MiB to 1024TiB, as bytes or with a unit`},
		{nil, []string{"--store-max-size", "4 gigs"}, `invalid --store-max-size "4 gigs"`},
		{nil, []string{"--store-max-size", "NaN"}, `invalid --store-max-size "NaN"`},
		{nil, []string{"--buffer-max", "+InfMiB"}, `invalid --buffer-max "+InfMiB"`},
		{nil, []string{"--buffer-max", "-1"}, `invalid --buffer-max "-1": allowed from 0 to 64GiB`},
		{nil, []string{"--gomaxprocs", "-2"}, `invalid --gomaxprocs -2: allowed 0 (Go's default) or more`},
		{[]string{"DEPTRACE_RETENTION_DAYS=1h"}, nil, `invalid --retention-minutes 48h (its default): longer than --retention-days 1h; allowed at most each coarser level's window: set --retention-minutes to 1h or less (set from DEPTRACE_RETENTION_DAYS)`},
	}
	for _, c := range cases {
		stdout, stderr, code := run(t, c.env, append([]string{"agent", "--store", t.TempDir() + "/x.db"}, c.args...)...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], c.want) || stdout != "" {
			t.Errorf("%v %v: exit %d, stdout %q, stderr %q; want one line with %q", c.env, c.args, code, stdout, stderr, c.want)
		}
	}
}

func TestAgentRetentionFlagValues(t *testing.T) {
	for _, c := range []struct {
		v    string
		want int64
	}{{"4GiB", 4 << 30}, {"500MB", 500e6}, {"1.5GiB", 3 << 29}, {"0", 0}, {"16777216", 16 << 20}, {" 20 GB", 20e9}} {
		if got, err := parseBytes("--store-max-size", c.v, 16<<20, 1<<50, "0 (no ceiling) or"); err != nil || got != c.want {
			t.Errorf("%q: %d, %v; want %d", c.v, got, err, c.want)
		}
	}
	for _, n := range []int64{4 << 30, 64 << 20, 3 << 29} {
		if got, err := parseBytes("--x", formatBytes(n), 0, 1<<50, ""); err != nil || got != n {
			t.Errorf("%d written as %q reads back as %d, %v", n, formatBytes(n), got, err)
		}
	}
	d := store.DefaultRetention
	for _, l := range retentionLevels {
		if got, err := cli.ParseAge(formatAge(l.of(d))); err != nil || got != l.of(d) {
			t.Errorf("default of --retention-%s written as %q reads back as %s, %v", l.name, formatAge(l.of(d)), got, err)
		}
	}
	cmd := newAgentCmd()
	if err := cmd.ParseFlags([]string{"--retention", "30d"}); err != nil {
		t.Fatal(err)
	}
	r, err := agentRetention(cmd, "30d", [3]string{"48h", "30d", "400d"})
	if month := 30 * 24 * time.Hour; err != nil || r != (store.Retention{Minutes: month, Hours: month, Days: month}) {
		t.Errorf("--retention 30d: %+v, %v; want every level 30 days", r, err)
	}
	r, err = agentRetention(newAgentCmd(), "", [3]string{"48h", "30d", "400d"})
	if err != nil || r != d {
		t.Errorf("defaults: %+v, %v; want %+v", r, err, d)
	}
}

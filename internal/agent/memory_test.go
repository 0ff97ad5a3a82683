package agent

import (
	"log/slog"
	"runtime/debug"
	"strings"
	"testing"
)

// The agent collects at GCPercent under a soft limit of the Go part of
// the documented ceiling and the batches it may keep in memory, unless
// the environment sets GOGC or GOMEMLIMIT.
func TestGCTargets(t *testing.T) {
	env := func(set ...string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			for _, s := range set {
				if s == k {
					return "50", true
				}
			}
			return "", false
		}
	}
	// 65,536 flows, a spill of 8,192 and 64 cache slots on each of 2
	// CPUs, 6.5 KiB each; 20,000 series of 7 KiB.
	const above = (65536+8192+128)*13<<9 + 20000*7<<10
	if got := MemoryCeiling(65536, 2, 20000); got != 96<<20+above {
		t.Errorf("ceiling %d, want %d", got, 96<<20+above)
	}
	// The limit: the Go runtime's 64 MiB of the base, and 10 MiB of
	// batches.
	const want = above + 64<<20 + 10<<20
	for _, c := range []struct {
		env     []string
		percent int
		limit   int64
	}{
		{nil, GCPercent, want},
		{[]string{"GOGC"}, -1, want},
		{[]string{"GOMEMLIMIT"}, GCPercent, -1},
		{[]string{"GOGC", "GOMEMLIMIT"}, -1, -1},
	} {
		percent, limit := gcTargets(65536, 2, 20000, 10<<20, false, env(c.env...))
		if percent != c.percent || limit != c.limit {
			t.Errorf("environment %v: percent %d and limit %d, want %d and %d", c.env, percent, limit, c.percent, c.limit)
		}
		// A pinned kernel side keeps batches in the kernel: no --buffer-max.
		pinnedLimit := c.limit
		if pinnedLimit >= 0 {
			pinnedLimit -= 10 << 20
		}
		if _, limit := gcTargets(65536, 2, 20000, 10<<20, true, env(c.env...)); limit != pinnedLimit {
			t.Errorf("environment %v, pinned: limit %d, want %d", c.env, limit, pinnedLimit)
		}
	}
	// setGC sets what it is given and leaves -1 alone.
	oldPercent, oldLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	defer func() { debug.SetGCPercent(oldPercent); debug.SetMemoryLimit(oldLimit) }()
	setGC(GCPercent, 1<<30)
	if p, l := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1); p != GCPercent || l != 1<<30 {
		t.Errorf("after setGC: percent %d, limit %d", p, l)
	}
	debug.SetGCPercent(100)
	setGC(-1, -1)
	if p, l := debug.SetGCPercent(100), debug.SetMemoryLimit(-1); p != 100 || l != 1<<30 {
		t.Errorf("setGC(-1, -1) changed the targets: percent %d, limit %d", p, l)
	}
}

// The soft limit follows the edges the cap holds, by steps of limitStep
// edges, and is left alone when GOMEMLIMIT set it.
func TestMemoryLimitFollowsEdges(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	const base = 8 << 30 // above what the tests use: no collection is forced
	l := memoryLimit{base: base}
	for _, c := range []struct {
		edges int
		want  int64
	}{
		{limitStep - 1, -1},
		{limitStep, base + limitStep*edgeBytes},
		{2*limitStep - 1, -1},
		{3 * limitStep, base + 3*limitStep*edgeBytes},
		{2*limitStep + 1, -1},
		{0, base},
	} {
		if got := l.follow(c.edges); got != c.want {
			t.Errorf("%d edges held: limit %d, want %d", c.edges, got, c.want)
		}
		if c.want >= 0 {
			if set := debug.SetMemoryLimit(-1); set != c.want {
				t.Errorf("%d edges held: the runtime's limit is %d, want %d", c.edges, set, c.want)
			}
		}
	}
	env := memoryLimit{base: -1}
	debug.SetMemoryLimit(1 << 30)
	if got := env.follow(10 * limitStep); got != -1 || debug.SetMemoryLimit(-1) != 1<<30 {
		t.Errorf("a limit from GOMEMLIMIT was changed (follow returned %d)", got)
	}
}

// --gomaxprocs applies unless it is 0 or the environment sets GOMAXPROCS
// to a value Go takes.
func TestMaxProcs(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	env := func(v string) func(string) (string, bool) {
		return func(k string) (string, bool) { return v, k == "GOMAXPROCS" }
	}
	for _, c := range []struct {
		want, got int
		lookup    func(string) (string, bool)
	}{{1, 1, none}, {3, 3, none}, {0, 0, none}, {1, 0, env("4")}, {0, 0, env("4")},
		{1, 1, env("")}, {1, 1, env("0")}, {1, 1, env("many")}, {1, 1, env("4294967296")}} { // values Go ignores
		if got := maxProcs(c.want, c.lookup); got != c.got {
			t.Errorf("--gomaxprocs %d: %d, want %d", c.want, got, c.got)
		}
	}
}

// The "go runtime" line says where each value came from: GOGC or
// GOMEMLIMIT only when the environment set one Go took, else deptrace
// and why.
func TestGoRuntimeAttrsSayWhereEachValueCameFrom(t *testing.T) {
	line := func(env map[string]string, wantProcs, percent int, limit int64) string {
		var b strings.Builder
		lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
		slog.New(slog.NewTextHandler(&b, nil)).Info("go runtime", goRuntimeAttrs(1, wantProcs, percent, limit, lookup)...)
		return b.String()
	}
	for _, c := range []struct {
		name          string
		env           map[string]string
		wantProcs     int
		percent       int
		limit         int64
		want, notWant []string
	}{
		{"deptrace's own", nil, 1, GCPercent, 300 << 20, []string{`gomaxprocs=1 gomaxprocs_from="--gomaxprocs (default 1:`, `gc_percent=200 gc_percent_from="deptrace (`, `memory_limit_mib=300 memory_limit_from="deptrace (`},
			[]string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "=-1"}},
		{"from the environment", map[string]string{"GOGC": "50", "GOMEMLIMIT": "900MiB", "GOMAXPROCS": "3"}, 1, -1, -1,
			[]string{"gomaxprocs_from=GOMAXPROCS", "gc_percent=50 gc_percent_from=GOGC", "memory_limit=900MiB memory_limit_from=GOMEMLIMIT"}, []string{"deptrace", "=-1"}},
		{"GOGC only; Go's processors", map[string]string{"GOGC": "off", "GOMAXPROCS": "0"}, 0, -1, 300 << 20,
			[]string{`gomaxprocs_from="Go's default (--gomaxprocs 0)"`, "gc_percent=off gc_percent_from=GOGC", `memory_limit_mib=300 memory_limit_from="deptrace (`}, []string{"GOMEMLIMIT", "gomaxprocs_from=GOMAXPROCS"}},
	} {
		got := line(c.env, c.wantProcs, c.percent, c.limit)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", c.name, got, w)
			}
		}
		for _, w := range c.notWant {
			if strings.Contains(got, w) {
				t.Errorf("%s: %q has %q", c.name, got, w)
			}
		}
	}
}

// GOGC and GOMEMLIMIT win only with a value the Go runtime uses.
func TestGoTakes(t *testing.T) {
	for _, c := range []struct {
		name, value string
		set, want   bool
	}{
		{"GOGC", "", false, false}, {"GOGC", "", true, false}, {"GOGC", "50", true, true}, {"GOGC", "off", true, true},
		{"GOGC", "lots", true, false}, {"GOMEMLIMIT", "", true, false}, {"GOMEMLIMIT", "900MiB", true, true},
		{"GOMEMLIMIT", "off", true, true}, {"GOMAXPROCS", "3", true, true}, {"GOMAXPROCS", "-1", true, false},
	} {
		lookup := func(k string) (string, bool) { return c.value, c.set && k == c.name }
		if got := goTakes(lookup, c.name); got != c.want {
			t.Errorf("%s=%q (set: %v): %v, want %v", c.name, c.value, c.set, got, c.want)
		}
	}
}

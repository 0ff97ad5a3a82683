package main

import (
	"strings"
	"testing"
)

// diff with one end of --before-since/--before-until: the other
// defaults as /api/diff defaults it (cli.BeforeWindow): only
// --before-since ends the earlier window at --since, only --before-until
// makes it as long as [--since, --until). Each used to default to the
// zero time, no bound. Over seedStore: curl -> nginx -> postgres and
// nginx -> gunicorn an hour ago, nginx -> cache 2 minutes ago.
func TestDiffDefaultsTheMissingEndOfTheWindowBefore(t *testing.T) {
	db := seedStore(t, "")
	diff := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(t, nil, append([]string{"diff", "--store", db}, args...)...)
		if code != 0 {
			t.Fatalf("diff %v: exit %d, %s", args, code, errOut)
		}
		return out
	}
	const cache = "+ nginx on web (198.51.100.2) -> tcp 203.0.113.5:6379 (external)"
	// [2h ago, 5m ago): the hour-old edges, gone since; the cache edge
	// new (with no end, the earlier window held it too: nothing appeared).
	out := diff("--since", "5m", "--before-since", "2h")
	if !strings.Contains(out, cache) || strings.Count(out, "+ ") != 1 || strings.Count(out, "- ") != 3 ||
		!strings.Contains(out, "- curl on client (198.51.100.1) -> tcp/80 nginx on web (198.51.100.2)") {
		t.Errorf("diff --since 5m --before-since 2h: want the cache edge appeared and the 3 older ones gone:\n%s", out)
	}
	// [35m ago, 30m ago), as long as [5m ago, now): empty, so only the
	// cache edge appeared (with no start, the earlier window held all the
	// older edges: 3 gone).
	out = diff("--since", "5m", "--before-until", "30m")
	if !strings.Contains(out, cache) || strings.Count(out, "\n") != 1 {
		t.Errorf("diff --since 5m --before-until 30m: want only the cache edge appeared:\n%s", out)
	}
	// [40m ago, 20m ago) is empty; before it, as long: [65m ago, 45m
	// ago) holds the hour-old edges, gone since, and [55m ago, 35m ago)
	// nothing.
	out = diff("--since", "40m", "--until", "20m", "--before-until", "45m")
	if strings.Count(out, "- ") != 3 || strings.Count(out, "\n") != 3 {
		t.Errorf("diff --since 40m --until 20m --before-until 45m: want the 3 hour-old edges gone:\n%s", out)
	}
	out = diff("--since", "40m", "--until", "20m", "--before-until", "35m")
	if out != "no edge appeared or disappeared\n" {
		t.Errorf("diff --since 40m --until 20m --before-until 35m: want no change:\n%s", out)
	}
}

// A window before that does not start before it ends, and a --since
// after now without --until, are one-line errors naming the flags; the
// first say which ends were defaulted and from what, in the words
// /api/diff uses (cli.BeforeWindow), with their parameters' names.
func TestDiffRefusesABackwardWindow(t *testing.T) {
	db := seedStore(t, "")
	const (
		since, until = "2026-11-21T10:00:00Z", "2026-11-21T12:00:00Z"
		first        = "1678-01-01T00:00:00Z" // cli.MinTime
	)
	for _, c := range []struct {
		args []string
		want string
	}{
		// Only --before-since: the window ends at --since.
		{[]string{"--since", since, "--until", until, "--before-since", "2026-11-21T11:00:00Z"},
			"invalid range: --before-since 2026-11-21T11:00:00Z is not before --before-until 2026-11-21T10:00:00Z (--before-until defaults to --since): allowed a window that starts before it ends"},
		// Only --before-until: the defaulted start is held at the earliest time.
		{[]string{"--since", since, "--until", until, "--before-until", first},
			"invalid range: --before-since 1678-01-01T00:00:00Z is not before --before-until 1678-01-01T00:00:00Z (--before-since defaults to --before-until minus the length of [--since, --until), no earlier than 1678-01-01T00:00:00Z): allowed a --before-until after 1678-01-01T00:00:00Z"},
		// Neither: a --since at the earliest time leaves no room before it.
		{[]string{"--since", first, "--until", "1678-01-02T00:00:00Z"},
			"invalid range: --before-since 1678-01-01T00:00:00Z is not before --before-until 1678-01-01T00:00:00Z (neither was given: --before-until defaults to --since, --before-since to --before-until minus the length of [--since, --until), no earlier than 1678-01-01T00:00:00Z): allowed a --since after 1678-01-01T00:00:00Z, or --before-since and --before-until"},
		// Both, backwards.
		{[]string{"--since", since, "--until", until, "--before-since", "2026-11-21T03:00:00Z", "--before-until", "2026-11-21T02:00:00Z"},
			"invalid range: --before-since 2026-11-21T03:00:00Z is not before --before-until 2026-11-21T02:00:00Z: allowed a window that starts before it ends"},
		{[]string{"--since", "2200-01-01T00:00:00Z"}, "invalid --since 2200-01-01T00:00:00Z: allowed a time before now (or give --until after it)"},
	} {
		stdout, stderr, code := run(t, nil, append([]string{"diff", "--store", db}, c.args...)...)
		if code != 1 || stderr != "deptrace: "+c.want+"\n" || stdout != "" {
			t.Errorf("diff %v: exit %d, stdout %q, stderr\n%s\nwant exit 1 and one line:\ndeptrace: %s", c.args, code, stdout, stderr, c.want)
		}
	}
}

// A time beyond the store's nanoseconds (years before 1678 or from 2262)
// is a one-line error naming the flag; it used to wrap around (look
// --since 2300-01-01 printed all history).
func TestTimesBeyondNanosecondsAreRefused(t *testing.T) {
	db := seedStore(t, "")
	const allowed = `: out of range: allowed a time from 1678-01-01T00:00:00Z to 2262-01-01T00:00:00Z`
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"look", "curl", "--since", "2300-01-01"}, `invalid --since "2300-01-01"` + allowed},
		{[]string{"graph", "--since", "1h", "--until", "2999-01-01"}, `invalid --until "2999-01-01"` + allowed},
		{[]string{"graph", "--since", "1600-01-01"}, `invalid --since "1600-01-01"` + allowed},
		{[]string{"diff", "--since", "1h", "--before-since", "1500-01-01"}, `invalid --before-since "1500-01-01"` + allowed},
		{[]string{"diff", "--since", "1h", "--before-until", "3000-01-01T00:00:00Z"}, `invalid --before-until "3000-01-01T00:00:00Z"` + allowed},
	} {
		stdout, stderr, code := run(t, nil, append(c.args, "--store", db)...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 1 || len(lines) != 1 || !strings.HasPrefix(lines[0], "deptrace: ") || !strings.Contains(lines[0], c.want) || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 and one line with %q", c.args, code, stdout, stderr, c.want)
		}
	}
}

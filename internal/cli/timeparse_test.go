package cli

import (
	"strings"
	"testing"
	"time"
)

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 11, 21, 15, 30, 0, 0, time.Local)
	cases := map[string]time.Time{
		"":                     {},
		"now":                  now,
		"1h":                   now.Add(-time.Hour),
		"-90m":                 now.Add(-90 * time.Minute),
		"2d":                   now.Add(-48 * time.Hour),
		"0.5d":                 now.Add(-12 * time.Hour),
		"2026-11-20":           time.Date(2026, 11, 20, 0, 0, 0, 0, time.Local),
		"2026-11-20 08:15":     time.Date(2026, 11, 20, 8, 15, 0, 0, time.Local),
		"2026-11-20 08:15:30":  time.Date(2026, 11, 20, 8, 15, 30, 0, time.Local),
		"2026-11-20T08:15":     time.Date(2026, 11, 20, 8, 15, 0, 0, time.Local),
		"09:00":                time.Date(2026, 11, 21, 9, 0, 0, 0, time.Local),
		"20:06:10":             time.Date(2026, 11, 21, 20, 6, 10, 0, time.Local),
		"2026-11-20T08:15:30":  time.Date(2026, 11, 20, 8, 15, 30, 0, time.Local),
		" 09:00 ":              time.Date(2026, 11, 21, 9, 0, 0, 0, time.Local),
		"2026-11-20T08:00:00Z": time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC),
	}
	for in, want := range cases {
		got, err := ParseTime(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	// "--1h" would be a negative age once the "-" is taken: not a time.
	for _, bad := range []string{"yesterday-ish", "13:99", "13:00:61", "--1h", "-d", "1e9d", "2026-13-01"} {
		if got, err := ParseTime(bad, now); err == nil || !strings.Contains(err.Error(), "allowed RFC 3339") {
			t.Errorf("%q: got %v, %v; want an error naming the allowed forms", bad, got, err)
		}
	}
}

func TestParseAge(t *testing.T) {
	for in, want := range map[string]time.Duration{"90s": 90 * time.Second, "1h30m": 90 * time.Minute, "2d": 48 * time.Hour, "0": 0} {
		if got, err := ParseAge(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"-1h", "-2d", "x", "1y", "200000d"} {
		if _, err := ParseAge(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// The store keeps times as nanoseconds since 1970 in 64 bits: a time
// beyond them wrapped around (since=2999-01-01 selected all history), so
// it is refused, saying what is allowed; the ends themselves are kept.
func TestParseTimeRefusesTimesBeyondNanoseconds(t *testing.T) {
	now := time.Date(2026, 11, 21, 15, 30, 0, 0, time.Local)
	const want = "out of range: allowed a time from 1678-01-01T00:00:00Z to 2262-01-01T00:00:00Z (the store's nanoseconds since 1970 in 64 bits)"
	for _, bad := range []string{"2999-01-01", "2300-01-01", "2262-01-01T00:00:01Z", "2262-04-12T00:00:00Z", "9999-12-31 23:59",
		"1677-12-31T23:59:59Z", "1600-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "1000-01-01"} {
		if got, err := ParseTime(bad, now); err == nil || err.Error() != want {
			t.Errorf("%q: got %v, %v; want %q", bad, got, err, want)
		}
	}
	for in, want := range map[string]time.Time{
		"2262-01-01T00:00:00Z": MaxTime,
		"1678-01-01T00:00:00Z": MinTime,
		"2261-12-31T23:59:59Z": time.Date(2261, 12, 31, 23, 59, 59, 0, time.UTC),
		"1678-01-01T00:00:01Z": time.Date(1678, 1, 1, 0, 0, 1, 0, time.UTC),
		"100000d":              now.Add(-100000 * 24 * time.Hour), // the longest age: 1753
	} {
		got, err := ParseTime(in, now)
		if err != nil || !got.Equal(want) || !time.Unix(0, got.UnixNano()).Equal(got) {
			t.Errorf("%q: %v %v, want %v, its nanoseconds in an int64", in, got, err, want)
		}
	}
}

// diff's window before [since, until): the missing end of
// --before-since/--before-until (before_since/before_until) defaults
// from the other and from the current window.
var flagNames = WindowNames{Since: "--since", Until: "--until", BeforeSince: "--before-since", BeforeUntil: "--before-until"}

func TestBeforeWindow(t *testing.T) {
	at := func(h int) time.Time { return time.Date(2026, 11, 21, h, 0, 0, 0, time.UTC) }
	var none time.Time
	since, until := at(10), at(12) // a window of 2 hours
	for _, c := range []struct {
		name           string
		bs, bu         time.Time
		wantBs, wantBu time.Time
		wantErr        bool
	}{
		{"neither: the same length just before since", none, none, at(8), at(10), false},
		{"only before_since: ends at since", at(3), none, at(3), at(10), false},
		{"only before_until: as long as the current window", none, at(6), at(4), at(6), false},
		{"both: as given", at(1), at(2), at(1), at(2), false},
		{"both, backwards: an error", at(2), at(1), at(2), at(1), true},
	} {
		bs, bu, err := BeforeWindow(since, until, c.bs, c.bu, flagNames)
		if !bs.Equal(c.wantBs) || !bu.Equal(c.wantBu) || (err != nil) != c.wantErr {
			t.Errorf("%s: [%s, %s), %v, want [%s, %s)", c.name, bs, bu, err, c.wantBs, c.wantBu)
		}
	}
	// A window longer than a Duration holds, or starting before MinTime:
	// the window before starts at MinTime, not at a wrapped time.
	if bs, bu, err := BeforeWindow(MinTime.Add(time.Hour), MaxTime, none, none, flagNames); err != nil || !bs.Equal(MinTime) || !bu.Equal(MinTime.Add(time.Hour)) {
		t.Errorf("the longest window: before it [%s, %s), want [%s, %s)", bs, bu, MinTime, MinTime.Add(time.Hour))
	}
}

// A window before that does not start before it ends is an error, in
// the caller's names, that says which ends were defaulted and from what;
// a defaulted start held at MinTime says what to give instead. The CLI's
// diff and /api/diff print this sentence as it is.
func TestBeforeWindowErrorsNameTheDefaultedEnd(t *testing.T) {
	at := func(h int) time.Time { return time.Date(2026, 11, 21, h, 0, 0, 0, time.UTC) }
	for _, c := range []struct {
		name                 string
		since, until, bs, bu time.Time
		err                  string
	}{
		{name: "only --before-since: it ends at --since", since: at(10), until: at(12), bs: at(11),
			err: "invalid range: --before-since 2026-11-21T11:00:00Z is not before --before-until 2026-11-21T10:00:00Z (--before-until defaults to --since): allowed a window that starts before it ends"},
		{name: "only --before-until: the start held at MinTime", since: at(10), until: at(12), bu: MinTime,
			err: "invalid range: --before-since 1678-01-01T00:00:00Z is not before --before-until 1678-01-01T00:00:00Z (--before-since defaults to --before-until minus the length of [--since, --until), no earlier than 1678-01-01T00:00:00Z): allowed a --before-until after 1678-01-01T00:00:00Z"},
		{name: "neither: --since at MinTime leaves no room before it", since: MinTime, until: MinTime.Add(24 * time.Hour),
			err: "invalid range: --before-since 1678-01-01T00:00:00Z is not before --before-until 1678-01-01T00:00:00Z (neither was given: --before-until defaults to --since, --before-since to --before-until minus the length of [--since, --until), no earlier than 1678-01-01T00:00:00Z): allowed a --since after 1678-01-01T00:00:00Z, or --before-since and --before-until"},
		{name: "both, backwards", since: at(10), until: at(12), bs: at(3), bu: at(2),
			err: "invalid range: --before-since 2026-11-21T03:00:00Z is not before --before-until 2026-11-21T02:00:00Z: allowed a window that starts before it ends"},
	} {
		if _, _, err := BeforeWindow(c.since, c.until, c.bs, c.bu, flagNames); err == nil || err.Error() != c.err {
			t.Errorf("%s:\n got %v\nwant %s", c.name, err, c.err)
		}
	}
}

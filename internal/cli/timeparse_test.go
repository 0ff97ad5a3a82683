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
	for _, bad := range []string{"yesterday-ish", "13:99", "--1h", "-d", "1e9d", "2026-13-01"} {
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

package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 11, 21, 15, 30, 0, 0, time.Local)
	cases := map[string]time.Time{
		"now":                  now,
		"1h":                   now.Add(-time.Hour),
		"-90m":                 now.Add(-90 * time.Minute),
		"2d":                   now.Add(-48 * time.Hour),
		"2026-11-20":           time.Date(2026, 11, 20, 0, 0, 0, 0, time.Local),
		"2026-11-20 08:15":     time.Date(2026, 11, 20, 8, 15, 0, 0, time.Local),
		"09:00":                time.Date(2026, 11, 21, 9, 0, 0, 0, time.Local),
		"2026-11-20T08:00:00Z": time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC),
	}
	for in, want := range cases {
		got, err := parseTime("since", in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	if _, err := parseTime("since", "yesterday-ish", now); err == nil || !strings.Contains(err.Error(), "invalid --since") {
		t.Errorf("garbage: %v", err)
	}
}

func TestParseRetention(t *testing.T) {
	if d, err := parseRetention("30d"); err != nil || d != 30*24*time.Hour {
		t.Errorf("30d: %v %v", d, err)
	}
	if d, err := parseRetention("0"); err != nil || d != 0 {
		t.Errorf("0: %v %v", d, err)
	}
	for _, bad := range []string{"5m", "-1d", "forever"} {
		if _, err := parseRetention(bad); err == nil || !strings.Contains(err.Error(), "at least 1h") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

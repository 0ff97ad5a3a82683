package main

import (
	"strings"
	"testing"
	"time"
)

// The forms are tested with cli.ParseTime; here, that the flag is named.
func TestParseTimeNamesTheFlag(t *testing.T) {
	now := time.Date(2026, 11, 21, 15, 30, 0, 0, time.Local)
	if got, err := parseTime("since", "1h", now); err != nil || !got.Equal(now.Add(-time.Hour)) {
		t.Errorf("1h: %v %v", got, err)
	}
	if _, err := parseTime("before-since", "yesterday-ish", now); err == nil || !strings.Contains(err.Error(), `invalid --before-since "yesterday-ish": allowed RFC 3339`) {
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

package agent

import (
	"strings"
	"testing"
	"time"
)

// A host id must read back as one host in queries, URLs, tables and
// metric labels.
func TestCheckHostID(t *testing.T) {
	for _, ok := range []string{"", "web-1", "db.example.com", "ip-10-0-0-1.ec2.internal", "búcharest:1"} {
		if err := CheckHostID(ok); err != nil {
			t.Errorf("CheckHostID(%q) = %v, want accepted", ok, err)
		}
	}
	for _, bad := range []string{"web/1", " ", "web 1", "a\nb", "tab\there", strings.Repeat("a", 254), "\xff"} {
		if err := CheckHostID(bad); err == nil {
			t.Errorf("CheckHostID(%q) accepted", bad)
		}
	}
}

// The start line gives retention as the flags take it.
func TestKeptFor(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "forever", 400 * 24 * time.Hour: "400d", 48 * time.Hour: "2d", 90 * time.Minute: "1h30m0s"} {
		if got := keptFor(d); got != want {
			t.Errorf("keptFor(%s) = %q, want %q", d, got, want)
		}
	}
}

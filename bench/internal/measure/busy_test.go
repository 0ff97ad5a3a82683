package measure

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "0", want: []int{0}},
		{in: "0-3,5,7-8", want: []int{0, 1, 2, 3, 5, 7, 8}},
		{in: "2-1", bad: true},
		{in: "x", bad: true},
	} {
		got, err := parseCPUList(tc.in)
		if (err != nil) != tc.bad || !tc.bad && !equalInts(got, tc.want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v (error: %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The idle residency is summed over every online CPU's states; a CPU
// online without cpuidle states, or an offline CPU's frozen counters,
// must not be taken for idle or busy time.
func TestIdleResidencyOfOnlineCPUs(t *testing.T) {
	sys := t.TempDir()
	write := func(rel, v string) {
		p := filepath.Join(sys, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("online", "0-1")
	write("cpu0/cpuidle/state0/time", "100")
	write("cpu0/cpuidle/state1/time", "2000")
	write("cpu1/cpuidle/state0/time", "0")
	write("cpu1/cpuidle/state1/time", "900")
	write("cpu2/cpuidle/state1/time", "123456") // offline
	var pinned []int
	pin := func(cpu int) error {
		pinned = append(pinned, cpu)
		if cpu == 9 {
			return errors.New("not in this cpuset")
		}
		return nil
	}
	if cpus, idle := idleResidency(sys, pin); cpus != 2 || idle != 3000*time.Microsecond || !equalInts(pinned, []int{0, 1}) {
		t.Errorf("idleResidency = %d CPUs, %s, pinned to %v; want 2 CPUs, 3ms, pinned to each", cpus, idle, pinned)
	}
	write("online", "0-2")
	if cpus, idle := idleResidency(sys, pin); cpus != 3 || idle != 126456*time.Microsecond {
		t.Errorf("with cpu2 online: %d CPUs, %s; want 3 CPUs, 126.456ms", cpus, idle)
	}
	write("online", "0-3") // cpu3 has no cpuidle
	if cpus, _ := idleResidency(sys, pin); cpus != 0 {
		t.Errorf("a CPU without cpuidle states: %d CPUs read, want 0 (use /proc/stat)", cpus)
	}
	write("online", "0,9")
	write("cpu9/cpuidle/state0/time", "5")
	if cpus, _ := idleResidency(sys, pin); cpus != 0 {
		t.Errorf("a CPU this thread cannot run on: %d CPUs read, want 0 (use /proc/stat)", cpus)
	}
}

// Busy time from two readings: CPUs × wall − idle when both have the
// same CPUs' residency, else /proc/stat's ticks.
func TestBusySincePrefersIdleResidency(t *testing.T) {
	a := busyClock{mono: time.Second, cpus: 2, idle: 500 * time.Millisecond, ticks: 10 * time.Second, steal: time.Second}
	c := busyClock{mono: 3 * time.Second, cpus: 2, idle: 1500 * time.Millisecond, ticks: 14 * time.Second, steal: 1200 * time.Millisecond}
	if busy, src := c.busySince(a); busy != 2800*time.Millisecond || src != busyFromIdleStates {
		t.Errorf("busy %s from %q; want 2.8s (2 CPUs × 2 s − 1 s idle − 0.2 s steal) from the idle states", busy, src)
	}
	c.cpus = 0
	if busy, src := c.busySince(a); busy != 4*time.Second || src != busyFromTicks {
		t.Errorf("without residency: busy %s from %q; want /proc/stat's 4s", busy, src)
	}
}

// The pairs' header names where the busy time came from, and runs timed
// by the idle residency show how far /proc/stat's ticks were from it.
func TestPairedMarkdownNamesTheBusySource(t *testing.T) {
	rs := []PairedResult{{
		Load:    PairedLoad{Name: "udp", Rate: 5000},
		ExtraUs: []float64{1, 2}, BaseRates: []float64{5000, 5000}, TracedRates: []float64{5000, 5000},
		BusyBase: []float64{20, 21}, BusyTraced: []float64{22, 23},
		BusySources:  []string{busyFromIdleStates},
		TicksPerBusy: []float64{0.91, 0.69, 1.04},
	}}
	var b strings.Builder
	WritePairedMarkdown(&b, rs, PairedConfig{Pairs: 2, Phase: 5 * time.Second})
	out := b.String()
	for _, want := range []string{
		"busy CPU from the cpuidle residency counters (busy = CPUs × wall time − time in idle states − steal)",
		"/proc/stat's busy ticks over the same runs, against the busy time above (lowest-highest run): udp 0.69-1.04.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	rs[0].BusySources, rs[0].TicksPerBusy = []string{busyFromTicks}, nil
	b.Reset()
	WritePairedMarkdown(&b, rs, PairedConfig{Pairs: 2, Phase: 5 * time.Second})
	if out := b.String(); !strings.Contains(out, "busy CPU from /proc/stat's ticks") || strings.Contains(out, "busy ticks over the same runs") {
		t.Errorf("a run from /proc/stat:\n%s", out)
	}
}

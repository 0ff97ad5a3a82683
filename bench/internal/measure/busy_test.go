package measure

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
	if online, cpus, idle := idleResidency(sys, pin); online != "0-1" || cpus != 2 || idle != 3000*time.Microsecond || !equalInts(pinned, []int{0, 1}) {
		t.Errorf("idleResidency = %q, %d CPUs, %s, pinned to %v; want \"0-1\", 2 CPUs, 3ms, pinned to each", online, cpus, idle, pinned)
	}
	write("online", "0-2")
	if _, cpus, idle := idleResidency(sys, pin); cpus != 3 || idle != 126456*time.Microsecond {
		t.Errorf("with cpu2 online: %d CPUs, %s; want 3 CPUs, 126.456ms", cpus, idle)
	}
	write("online", "0-3") // cpu3 has no cpuidle
	if _, cpus, _ := idleResidency(sys, pin); cpus != 0 {
		t.Errorf("a CPU without cpuidle states: %d CPUs read, want 0 (use /proc/stat)", cpus)
	}
	write("online", "0,9")
	write("cpu9/cpuidle/state0/time", "5")
	if _, cpus, _ := idleResidency(sys, pin); cpus != 0 {
		t.Errorf("a CPU this thread cannot run on: %d CPUs read, want 0 (use /proc/stat)", cpus)
	}
}

// Busy time from two readings: CPUs × wall − idle when both have the
// same CPUs' residency, else /proc/stat's ticks.
func TestBusySincePrefersIdleResidency(t *testing.T) {
	a := busyClock{mono: time.Second, online: "0-1", cpus: 2, idle: 500 * time.Millisecond, ticks: 10 * time.Second, steal: time.Second}
	c := busyClock{mono: 3 * time.Second, online: "0-1", cpus: 2, idle: 1500 * time.Millisecond, ticks: 14 * time.Second, steal: 1200 * time.Millisecond}
	if busy, src := c.busySince(a); busy != 2800*time.Millisecond || src != busyFromIdleStates {
		t.Errorf("busy %s from %q; want 2.8s (2 CPUs × 2 s − 1 s idle − 0.2 s steal) from the idle states", busy, src)
	}
	for _, tc := range []struct {
		name string
		a, c busyClock
	}{
		{"no residency now", a, func() busyClock { c := c; c.cpus, c.online = 0, ""; return c }()},
		{"no residency before", func() busyClock { a := a; a.cpus, a.online = 0, ""; return a }(), c},
		{"a CPU more since", func() busyClock { a := a; a.cpus, a.online = 3, "0-2"; return a }(), c},
		{"other CPUs, as many", func() busyClock { a := a; a.online = "0,2"; return a }(), c},
		{"idle above all CPUs' time", a, func() busyClock { c := c; c.idle = 5 * time.Second; return c }()},
		{"idle below none", a, func() busyClock { c := c; c.idle = 0; return c }()},
	} {
		if busy, src := tc.c.busySince(tc.a); busy != 4*time.Second || src != busyFromTicks {
			t.Errorf("%s: busy %s from %q; want /proc/stat's 4s", tc.name, busy, src)
		}
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

// The pinned reads leave no thread of the process on one CPU: the thread
// they moved gets its affinity back and ends with them.
func TestIdleResidencyPinnedLeavesNoThreadPinned(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var cpus []string
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, strconv.Itoa(i))
		}
	}
	// With one CPU no thread can be narrowed, and only the readings below
	// are checked; the project's machines have two or more.
	sys := t.TempDir()
	if err := os.WriteFile(filepath.Join(sys, "online"), []byte(strings.Join(cpus, ",")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range cpus {
		if err := os.MkdirAll(filepath.Join(sys, "cpu"+c, "cpuidle", "state0"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sys, "cpu"+c, "cpuidle", "state0", "time"), []byte("1000\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := allowedList(t, "self")
	for range 20 {
		if _, n, idle := idleResidencyPinned(sys); n != len(cpus) || idle != time.Duration(len(cpus))*time.Millisecond {
			t.Fatalf("idleResidencyPinned = %d CPUs, %s; want %d, %s", n, idle, len(cpus), time.Duration(len(cpus))*time.Millisecond)
		}
	}
	deadline := time.Now().Add(5 * time.Second) // the moved threads exit after their goroutines
	for {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		var narrowed []string
		for _, task := range tasks {
			if got := allowedList(t, "self/task/"+task.Name()); got != "" && got != want {
				narrowed = append(narrowed, task.Name()+": "+got)
			}
		}
		if len(narrowed) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("threads left on fewer CPUs than the process's %s: %v", want, narrowed)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// allowedList is the Cpus_allowed_list of /proc/<p>/status ("" when the
// task has gone).
func allowedList(t *testing.T, p string) string {
	b, err := os.ReadFile("/proc/" + p + "/status")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("/proc/%s/status has no Cpus_allowed_list", p)
	return ""
}

// A pair whose runs took their busy time from different sources compares
// both runs' ticks, never residency against ticks.
func TestPairBusyFromOneSource(t *testing.T) {
	base := pairRun{busy: 3 * time.Second, ticks: 2 * time.Second, source: busyFromIdleStates}
	traced := pairRun{busy: 4 * time.Second, ticks: 3 * time.Second, source: busyFromIdleStates}
	if b, tr, src := pairBusy(base, traced); b != 3*time.Second || tr != 4*time.Second || src != busyFromIdleStates {
		t.Errorf("both from the residency: %s, %s from %q", b, tr, src)
	}
	traced.busy, traced.source = traced.ticks, busyFromTicks
	if b, tr, src := pairBusy(base, traced); b != 2*time.Second || tr != 3*time.Second || src != busyFromTicks {
		t.Errorf("traced run from ticks: %s, %s from %q; want both runs' ticks (2s, 3s)", b, tr, src)
	}
}

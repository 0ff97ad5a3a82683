package measure

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/loadgen"
)

func TestSampleCategory(t *testing.T) {
	for sym, want := range map[string]string{
		"bpf_prog_6deef7357e7b4530_on_tcp_state":      "program on_tcp_state",
		"bpf_prog_0123456789abcdef_on_tcp_state_last": "program on_tcp_state_last",
		"bpf_trace_run3":                     "tracepoint dispatch",
		"__traceiter_inet_sock_set_state":    "tracepoint dispatch",
		"__bpf_trace_inet_sock_set_state":    "tracepoint dispatch",
		"call_trace_sock_recv_length":        "tracepoint dispatch",
		"__cgroup_bpf_run_filter_getsockopt": "cgroup hook dispatch",
		"sockopt_alloc_buf":                  "cgroup hook dispatch",
		"__bpf_prog_run_save_cb":             "cgroup hook dispatch",
		"bpf_skc_to_tcp_sock":                "helpers and maps",
		"lookup_nulls_elem_raw":              "helpers and maps",
		"__htab_map_lookup_elem":             "helpers and maps",
		"tcp_v4_rcv":                         "",
		"[unknown]":                          "",
		"bpf_prog_short_name":                "helpers and maps", // not a JIT image name: a kernel function
	} {
		if got := sampleCategory(sym); got != want {
			t.Errorf("sampleCategory(%q) = %q, want %q", sym, got, want)
		}
	}
}

func TestCountSamples(t *testing.T) {
	out := `   4148 100.000100: ffffffff82027094 tcp_sync_mss
   4148 100.000200: ffffffffa0001234 bpf_prog_6deef7357e7b4530_on_tcp_state
    812 100.000300: ffffffff814ba6f8 bpf_trace_run3
    812 100.000400: ffffffff814ba6f8 bpf_trace_run3
    777 100.000500: 00000000004a1b2c runtime.mallocgc
    777 100.000600: ffffffff814ba6f8 bpf_trace_run3
    900 100.000700: ffffffff814ba6f8 bpf_trace_run3
      0 100.000800: ffffffff81e0d3a5 pv_native_safe_halt
    812 99.999000: ffffffff814ba6f8 bpf_trace_run3
    812 101.500000: ffffffff814ba6f8 bpf_trace_run3
`
	// Agent 777, perf 900, the load from 100 s to 101 s: the samples
	// before and after it, and perf's own, are left out.
	flt := sampleFilter{agentPID: 777, perfPID: 900, start: 100 * time.Second, end: 101 * time.Second}
	c, err := countSamples(strings.NewReader(out), flt)
	if err != nil {
		t.Fatal(err)
	}
	if c.Agent != 2 || c.ByCategory["tracepoint dispatch"] != 2 || c.ByCategory["program on_tcp_state"] != 1 || len(c.ByCategory) != 2 {
		t.Errorf("counted %+v; want agent 2, dispatch 2 (the agent's, perf's and those outside the load excluded), on_tcp_state 1", c)
	}
	if c.All != 8 || c.Idle != 1 {
		t.Errorf("all %d, idle %d; want the 8 samples of the load's time, perf's included, 1 of them idle", c.All, c.Idle)
	}
	if _, err := countSamples(strings.NewReader("cpu-clock: garbage here\n"), flt); err == nil {
		t.Error("a line without a pid was accepted")
	}
}

func TestAttributionPairs(t *testing.T) {
	var a Attribution
	perRT := 1e9 / perfFreq / 1000 // one sample over 1,000 round trips, ns
	// Pair 1: the program appears only traced; pair 2 adds a category the
	// first pair lacked, which counts 0 there.
	a.addPair(SampleCounts{ByCategory: map[string]int{"helpers and maps": 1}}, SampleCounts{ByCategory: map[string]int{"program p": 10, "helpers and maps": 3}, Agent: 4}, 1000, 1000)
	a.addPair(SampleCounts{ByCategory: map[string]int{}}, SampleCounts{ByCategory: map[string]int{"program p": 20, "tracepoint dispatch": 5}}, 1000, 2000)
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	want := map[string][]float64{
		"program p":           {10 * perRT, 10 * perRT}, // 20 samples over twice the round trips
		"helpers and maps":    {2 * perRT, 0},
		"tracepoint dispatch": {0, 2.5 * perRT},
		agentCategory:         {4 * perRT, 0},
	}
	if a.Pairs != 2 || len(a.PerPair) != len(want) {
		t.Fatalf("%d pairs, categories %v", a.Pairs, a.PerPair)
	}
	for k, w := range want {
		got := a.PerPair[k]
		if len(got) != 2 || !near(got[0], w[0]) || !near(got[1], w[1]) {
			t.Errorf("%s: %v, want %v", k, got, w)
		}
	}
	if tot := a.Total(); !near(tot[0], 16*perRT) || !near(tot[1], 12.5*perRT) {
		t.Errorf("totals %v, want %v and %v", tot, 16*perRT, 12.5*perRT)
	}
}

// The attribution's whole against /proc/stat: perf's busy samples, at
// 1/perfFreq s each, must add up to /proc/stat's busy time: up to 35 %
// above it (tick accounting misses short bursts), 15 % below it.
func TestCheckBusyAgrees(t *testing.T) {
	c := SampleCounts{All: 100000, Idle: 20000} // 80,000 busy samples: 16.0 s at 4999 Hz
	for _, ok := range []time.Duration{16 * time.Second, 14 * time.Second, 11 * time.Second, 18 * time.Second} {
		if err := checkBusyAgrees(c, ok, busyFromTicks, 10*time.Second, 0.15, 0.35); err != nil {
			t.Errorf("16 s against %s: %v", ok, err)
		}
	}
	err := checkBusyAgrees(c, 10*time.Second, busyFromTicks, 10*time.Second, 0.15, 0.35)
	if err == nil || !strings.Contains(err.Error(), "80000 busy samples at 4999 Hz stand for 16s of CPU, /proc/stat gives 10s") || !strings.Contains(err.Error(), "38 % above it, tolerance 35 %") {
		t.Errorf("16 s against 10 s: %v", err)
	}
	err = checkBusyAgrees(c, 19*time.Second, busyFromTicks, 10*time.Second, 0.15, 0.35)
	if !errors.Is(err, errPerfUnusable) || !strings.Contains(err.Error(), "16 % below it, tolerance 15 %") {
		t.Errorf("16 s against 19 s: %v", err)
	}
	lost := c
	lost.Lost = 3
	if err := checkBusyAgrees(lost, 16*time.Second, busyFromTicks, 10*time.Second, 0.15, 0.35); err == nil || !strings.Contains(err.Error(), "perf lost 3 samples") {
		t.Errorf("a run with lost samples: %v", err)
	}
	if err := checkBusyAgrees(SampleCounts{}, time.Second, busyFromTicks, time.Second, 0.15, 0.35); err == nil {
		t.Error("a run without samples passed")
	}
	// From the idle residency, perf may read lower (interrupts on a CPU
	// that left idle), not higher.
	below, above := busyTolerances(busyFromIdleStates)
	if err := checkBusyAgrees(c, 18*time.Second, busyFromIdleStates, 10*time.Second, below, above); err != nil {
		t.Errorf("16 s of samples against 18 s of residency: %v", err)
	}
	if err := checkBusyAgrees(c, 19500*time.Millisecond, busyFromIdleStates, 10*time.Second, below, above); err != nil {
		t.Errorf("16 s of samples against 19.5 s of residency (18 %% below): %v", err)
	}
	err = checkBusyAgrees(c, 20500*time.Millisecond, busyFromIdleStates, 10*time.Second, below, above)
	if !errors.Is(err, errPerfUnusable) || !strings.Contains(err.Error(), "22 % below it, tolerance 20 %") {
		t.Errorf("16 s of samples against 20.5 s of residency: %v", err)
	}
	err = checkBusyAgrees(c, 14*time.Second, busyFromIdleStates, 10*time.Second, below, above)
	if err == nil || !strings.Contains(err.Error(), "cpuidle residency gives 14s") || !strings.Contains(err.Error(), "13 % above it, tolerance 10 %") {
		t.Errorf("16 s of samples against 14 s of residency: %v", err)
	}
}

func TestCountLost(t *testing.T) {
	stats := "Aggregated stats:\n           TOTAL events:      33819\n            LOST events:          2  ( 0.0%)\n    LOST_SAMPLES events:          5  ( 0.0%)\n          SAMPLE events:      31899  (94.3%)\n"
	if n := countLost(stats); n != 7 {
		t.Errorf("countLost = %d, want 7", n)
	}
	if n := countLost("           TOTAL events:      33819\n          SAMPLE events:      31899  (94.3%)\n"); n != 0 {
		t.Errorf("countLost without LOST lines = %d, want 0", n)
	}
}

// A pair is compared only when both runs carry the load asked: both at
// 95 % of the rate, or, asked above reach, within 10 % of each other.
func TestCheckPair(t *testing.T) {
	l := PairedLoad{Name: "short-lived TCP, 1,000 client hosts", Rate: 5000}
	ok := loadgen.Result{Rate: 4990}
	if err := checkPair("p", l, ok, ok, 0.95); err != nil {
		t.Errorf("both reached: %v", err)
	}
	err := checkPair("paired x, pair 2", l, loadgen.Result{Rate: 1624}, ok, 0.95)
	if err == nil || !strings.Contains(err.Error(), "pair 2, untraced run reached 1624/s of the 5000/s asked") {
		t.Errorf("untraced short: %v", err)
	}
	if err := checkPair("p", l, ok, loadgen.Result{Rate: 32}, 0.95); err == nil || !strings.Contains(err.Error(), "traced run reached 32/s") {
		t.Errorf("traced short: %v", err)
	}
	above := PairedLoad{Rate: 40000, AboveReach: true}
	if err := checkPair("p", above, loadgen.Result{Rate: 16000}, loadgen.Result{Rate: 15500}, 0.95); err != nil {
		t.Errorf("above reach, 3 %% apart: %v", err)
	}
	if err := checkPair("p", above, loadgen.Result{Rate: 16000}, loadgen.Result{Rate: 9000}, 0.95); err == nil || !strings.Contains(err.Error(), "44 % apart") {
		t.Errorf("above reach, 44 %% apart: %v", err)
	}
	if err := checkPair("p", l, loadgen.Result{Rate: 10}, ok, 0); err != nil {
		t.Errorf("min 0 checks nothing: %v", err)
	}
}

// Package measure measures deptrace's own cost: the run time of each kernel
// program per invocation, the agent's CPU, and what tracing does to the
// throughput of a load.
package measure

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/loadgen"
	"github.com/deptrace/deptrace/internal/output"
	"github.com/deptrace/deptrace/tracer"
)

// OverheadConfig is one overhead benchmark run.
type OverheadConfig struct {
	Duration    time.Duration // per phase
	Concurrency int           // short-lived clients, and persistent connections
	MsgSize     int
	Workloads   []string
	// Rate paces the load (round trips per second); 0 runs it flat out.
	Rate float64
	// LoadCommand starts the load generator as its own process (so its CPU
	// is not the agent's); it gets `--workload ... --json` appended.
	LoadCommand []string
}

// ProgramRun is one kernel program's cost under load, with statistics on.
type ProgramRun struct {
	Program      string
	Runs         uint64
	AvgNs        float64
	RunsPerTrip  float64
	SharePercent float64 // of one core
}

// Measurement is the result for one workload.
type Measurement struct {
	Workload      string
	Baseline      loadgen.Result // no tracer
	Traced        loadgen.Result // tracer attached, bpf_stats off
	StatsRun      loadgen.Result // tracer attached, bpf_stats on
	BaselineAfter loadgen.Result // no tracer again: the noise floor
	AgentCPU      float64        // % of one core, user+system, during Traced
	KernelCPU     float64        // % of one core in kernel programs, from StatsRun
	KernelNsPerRT float64        // summed program time per round trip
	AvgNsPerRun   float64        // over every program run
	FloorNs       float64        // avg of an empty program measured the same way
	Runs          uint64         // program runs during StatsRun
	Programs      []ProgramRun
	FlowsPerDrain float64
	EventsLost    uint64
}

// TotalCPU is agent plus kernel programs, % of one core.
func (m Measurement) TotalCPU() float64 { return m.AgentCPU + m.KernelCPU }

// NetNsPerRun is the average program run time less the measurement floor.
func (m Measurement) NetNsPerRun() float64 { return max(m.AvgNsPerRun-m.FloorNs, 0) }

// NetKernelCPU is the kernel programs' CPU less the measurement floor.
func (m Measurement) NetKernelCPU() float64 {
	return m.NetNsPerRun() * float64(m.Runs) / float64(m.StatsRun.Elapsed.Nanoseconds()) * 100
}

// ThroughputChange is traced rate against the mean of both baselines, %.
func (m Measurement) ThroughputChange() float64 {
	base := (m.Baseline.Rate + m.BaselineAfter.Rate) / 2
	return (m.Traced.Rate - base) / base * 100
}

// Noise is the difference between the two baselines, % of their mean.
func (m Measurement) Noise() float64 {
	base := (m.Baseline.Rate + m.BaselineAfter.Rate) / 2
	d := m.Baseline.Rate - m.BaselineAfter.Rate
	if d < 0 {
		d = -d
	}
	return d / base * 100
}

// Overhead runs, per workload: a baseline without deptrace, a run with the
// tracer attached measuring the agent's CPU (bpf_stats off, so statistics
// do not inflate it), a run with bpf_stats on measuring program run time,
// and a second baseline.
func Overhead(ctx context.Context, cfg OverheadConfig, progress io.Writer) ([]Measurement, error) {
	var out []Measurement
	for _, w := range cfg.Workloads {
		m := Measurement{Workload: w}
		step := func(name string) { fmt.Fprintf(progress, "bench: %s: %s (%s)\n", w, name, cfg.Duration) }
		var err error

		step("baseline, no tracer")
		if m.Baseline, err = runLoad(ctx, cfg, w); err != nil {
			return out, err
		}

		t, err := tracer.New(tracer.DefaultConfig())
		if err != nil {
			return out, fmt.Errorf("load tracer: %w", err)
		}
		agentCtx, stopAgent := context.WithCancel(ctx)
		agentDone := make(chan error, 1)
		var drains, flows int
		var lost uint64
		go func() {
			sink, _ := output.New("jsonl", io.Discard, nil, time.Second) // format, and reuse flows, as trace does
			agentDone <- t.RunWith(agentCtx, tracer.RunOptions{ReuseFlows: true}, func(iv tracer.Interval) error {
				drains++
				flows += len(iv.Flows)
				lost += iv.Lost.Total()
				return sink.Write(iv.Flows, iv.Listeners)
			})
		}()
		close := func() { stopAgent(); <-agentDone; _ = t.Close() } //nolint:errcheck // a stop on purpose: Run's error is the cancellation

		step("tracer attached, agent CPU")
		before := processCPU()
		if m.Traced, err = runLoad(ctx, cfg, w); err != nil {
			close()
			return out, err
		}
		m.AgentCPU = (processCPU() - before).Seconds() / m.Traced.Elapsed.Seconds() * 100

		step("tracer attached, bpf_stats on, program run time")
		floor, err := attachFloorProbe()
		if err != nil {
			close()
			return out, err
		}
		stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			floor.Close()
			close()
			return out, fmt.Errorf("enable bpf_stats: %w", err)
		}
		s0, err0 := t.Stats()
		errFloor := floor.start()
		m.StatsRun, err = runLoad(ctx, cfg, w)
		s1, err1 := t.Stats()
		if errFloor == nil {
			m.FloorNs, errFloor = floor.nsPerRun()
		}
		_ = stats.Close() // turning bpf_stats off: nothing to report
		floor.Close()
		m.FlowsPerDrain = float64(flows) / float64(max(drains, 1))
		m.EventsLost = lost
		close()
		if err != nil {
			return out, err
		}
		if err0 != nil || err1 != nil {
			return out, fmt.Errorf("read program stats: %v %v", err0, err1)
		}
		if errFloor != nil {
			return out, errFloor
		}
		var totalNs, totalRuns uint64
		for name, p1 := range s1.Programs {
			p0 := s0.Programs[name]
			runs, ns := p1.RunCount-p0.RunCount, uint64(p1.RunTime-p0.RunTime)
			if runs == 0 {
				continue
			}
			totalNs += ns
			totalRuns += runs
			m.Programs = append(m.Programs, ProgramRun{
				Program:      name,
				Runs:         runs,
				AvgNs:        float64(ns) / float64(runs),
				RunsPerTrip:  float64(runs) / float64(m.StatsRun.RoundTrips),
				SharePercent: float64(ns) / float64(m.StatsRun.Elapsed.Nanoseconds()) * 100,
			})
		}
		sort.Slice(m.Programs, func(i, j int) bool { return m.Programs[i].Program < m.Programs[j].Program })
		m.KernelCPU = float64(totalNs) / float64(m.StatsRun.Elapsed.Nanoseconds()) * 100
		m.KernelNsPerRT = float64(totalNs) / float64(m.StatsRun.RoundTrips)
		if totalRuns > 0 {
			m.AvgNsPerRun = float64(totalNs) / float64(totalRuns)
		}
		m.Runs = totalRuns

		step("baseline again, no tracer")
		if m.BaselineAfter, err = runLoad(ctx, cfg, w); err != nil {
			return out, err
		}
		out = append(out, m)
	}
	return out, nil
}

func runLoad(ctx context.Context, cfg OverheadConfig, workload string) (loadgen.Result, error) {
	args := append([]string{}, cfg.LoadCommand[1:]...)
	args = append(args, "--workload", workload, "--concurrency", strconv.Itoa(cfg.Concurrency),
		"--msg-size", strconv.Itoa(cfg.MsgSize), "--duration", cfg.Duration.String(), "--serve", "127.0.0.1:0", "--output", "json",
		"--rate", strconv.FormatFloat(cfg.Rate, 'f', -1, 64))
	return runLoadProcess(ctx, cfg.LoadCommand[0], args)
}

// runLoadProcess runs `deptrace bench load ... --output json` as a process
// of its own, so that its CPU is never counted as the tracer's.
func runLoadProcess(ctx context.Context, bin string, args []string) (loadgen.Result, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return loadgen.Result{}, fmt.Errorf("load %v: %w: %s", args, err, bytes.TrimSpace(stderr.Bytes()))
	}
	r, err := ParseLoadResult(stdout.Bytes())
	if err != nil {
		return r, err
	}
	// Kernel programs run inside the load's syscalls and softirqs: its CPU
	// per round trip, traced against untraced, is an estimate of their true
	// cost that needs no bpf_stats.
	r.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return r, nil
}

// ParseLoadResult reads the JSON `deptrace bench load --output json` prints.
func ParseLoadResult(data []byte) (loadgen.Result, error) {
	var r loadgen.Result
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("parse load result %q: %w", bytes.TrimSpace(data), err)
	}
	if r.Workload == "" || r.Elapsed <= 0 {
		return r, fmt.Errorf("parse load result %q: no workload or duration", bytes.TrimSpace(data))
	}
	return r, nil
}

// WriteMarkdown renders measurements as the tables of docs/performance.md.
func WriteMarkdown(w io.Writer, ms []Measurement, cfg OverheadConfig) {
	host, _ := os.Hostname()
	var uts unix.Utsname
	_ = unix.Uname(&uts) // uname(2) does not fail with a valid buffer
	fmt.Fprintf(w, "Run: %s, host %s, kernel %s, %d s per phase, %d clients, %d-byte messages.\n\n",
		time.Now().UTC().Format(time.RFC3339), host, unix.ByteSliceToString(uts.Release[:]), int(cfg.Duration.Seconds()), cfg.Concurrency, cfg.MsgSize)
	fmt.Fprintln(w, "| workload | baseline rate/s | traced rate/s | 2nd baseline rate/s | change vs baselines | baseline noise | flows per drain | events lost |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, m := range ms {
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %+.1f %% | %.1f %% | %.1f | %d |\n",
			m.Workload, m.Baseline.Rate, m.Traced.Rate, m.BaselineAfter.Rate, m.ThroughputChange(), m.Noise(), m.FlowsPerDrain, m.EventsLost)
	}
	fmt.Fprintln(w, "\nCPU, % of one core. Kernel programs are measured with bpf_stats (its own clock reads are the floor, measured on an empty program on the same tracepoint); agent CPU is measured in a separate run with bpf_stats off.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workload | agent CPU | kernel programs, measured | kernel programs, net of floor | total tracing CPU (agent + measured) | total, net of floor | program runs per round trip | avg ns per run, measured | floor ns | avg ns per run, net | program ns per round trip, measured |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, m := range ms {
		fmt.Fprintf(w, "| %s | %.2f %% | %.2f %% | %.2f %% | %.2f %% | %.2f %% | %.1f | %.0f | %.0f | %.0f | %.0f |\n",
			m.Workload, m.AgentCPU, m.KernelCPU, m.NetKernelCPU(), m.TotalCPU(), m.AgentCPU+m.NetKernelCPU(),
			float64(m.Runs)/float64(max(m.StatsRun.RoundTrips, 1)), m.AvgNsPerRun, m.FloorNs, m.NetNsPerRun(), m.KernelNsPerRT)
	}
	for _, m := range ms {
		fmt.Fprintf(w, "\nPrograms under %s (bpf_stats on, %.0f round trips/s):\n\n", m.Workload, m.StatsRun.Rate)
		fmt.Fprintln(w, "| program | runs | avg ns per run | runs per round trip | % of one core |")
		fmt.Fprintln(w, "|---|---|---|---|---|")
		for _, p := range m.Programs {
			fmt.Fprintf(w, "| %s | %d | %.0f | %.2f | %.2f |\n", p.Program, p.Runs, p.AvgNs, p.RunsPerTrip, p.SharePercent)
		}
	}
	fmt.Fprintln(w, "\nThe load's own CPU per round trip (programs run inside its syscalls and softirqs; includes the load process start-up):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| workload | baseline | traced | 2nd baseline | traced minus mean baseline |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, m := range ms {
		base := (m.Baseline.CPUPerRoundTrip() + m.BaselineAfter.CPUPerRoundTrip()) / 2
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", m.Workload, m.Baseline.CPUPerRoundTrip(), m.Traced.CPUPerRoundTrip(),
			m.BaselineAfter.CPUPerRoundTrip(), m.Traced.CPUPerRoundTrip()-base)
	}
	fmt.Fprintln(w, "\nLatency (p50 / p99), baseline vs traced:")
	fmt.Fprintln(w)
	for _, m := range ms {
		fmt.Fprintf(w, "- %s: %s / %s vs %s / %s\n", m.Workload, m.Baseline.P50, m.Baseline.P99, m.Traced.P50, m.Traced.P99)
	}
}

package measure

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/bench/internal/baseline/fivetuple"
	"github.com/deptrace/deptrace/bench/internal/baseline/perevent"
	"github.com/deptrace/deptrace/bench/internal/baseline/poll"
	"github.com/deptrace/deptrace/bench/internal/baseline/stream"
	"github.com/deptrace/deptrace/tracer"
)

// Method is one way of producing bundled flows. The four methods of the
// published evaluation differ only in how they do it; all emit tracer.Flow.
type Method interface {
	Name() string
	// Collect returns what the method has seen since the previous call.
	Collect() ([]tracer.Flow, error)
	// KernelTime is the cumulative run count and run time of the method's
	// kernel programs (grows only while bpf_stats is on).
	KernelTime() (runs uint64, total time.Duration, err error)
	// Losses counts events the method knows it lost.
	Losses() uint64
	Close() error
}

// Method names, in the order results list them.
const (
	Polling   = "polling"
	Streaming = "streaming"
	FiveTuple = "five-tuple"
	Bundling  = "bundling"
)

// Methods lists every method name.
var Methods = []string{Polling, Streaming, FiveTuple, Bundling}

// NewMethod loads one method.
func NewMethod(name string) (Method, error) {
	switch name {
	case Polling:
		return progMethod{poll.New()}, nil
	case Streaming:
		m, err := stream.New()
		if err != nil {
			return nil, err
		}
		return perEventMethod(Streaming, m.Collect, m.Stats, m.Close), nil
	case FiveTuple:
		m, err := fivetuple.New()
		if err != nil {
			return nil, err
		}
		return perEventMethod(FiveTuple, m.Collect, m.Stats, m.Close), nil
	case Bundling:
		t, err := tracer.New(tracer.DefaultConfig())
		if err != nil {
			return nil, err
		}
		return &statsMethod{name: name, close: t.Close,
			collect: func() ([]tracer.Flow, error) { iv, err := t.Collect(); return iv.Flows, err },
			stats: func() (map[string]ProgramRuns, uint64, error) {
				s, err := t.Stats()
				runs := map[string]ProgramRuns{}
				for n, p := range s.Programs {
					runs[n] = ProgramRuns{p.RunCount, p.RunTime}
				}
				return runs, s.Lost.Total(), err
			}}, nil
	}
	return nil, fmt.Errorf("invalid method %q: allowed %v", name, Methods)
}

// perEventMethod wraps a baseline built on the per-call kernel side.
func perEventMethod(name string, collect func() ([]tracer.Flow, error), stats func() (perevent.Stats, error), closeFn func() error) Method {
	return &statsMethod{name: name, collect: collect, close: closeFn,
		stats: func() (map[string]ProgramRuns, uint64, error) {
			s, err := stats()
			runs := map[string]ProgramRuns{}
			for n, p := range s.Programs {
				runs[n] = ProgramRuns{p.RunCount, p.RunTime}
			}
			return runs, s.Lost(), err
		}}
}

// ProgramRuns are one kernel program's cumulative run count and run time.
type ProgramRuns struct {
	Count uint64
	Time  time.Duration
}

// progMethod adapts the baselines, which expose their programs.
type progMethod struct {
	impl interface {
		Name() string
		Collect() ([]tracer.Flow, error)
		Programs() []*ebpf.Program
		Losses() uint64
		Close() error
	}
}

func (p progMethod) Name() string                    { return p.impl.Name() }
func (p progMethod) Collect() ([]tracer.Flow, error) { return p.impl.Collect() }
func (p progMethod) Losses() uint64                  { return p.impl.Losses() }
func (p progMethod) Close() error                    { return p.impl.Close() }

func (p progMethod) KernelTime() (uint64, time.Duration, error) {
	var runs uint64
	var total time.Duration
	for _, prog := range p.impl.Programs() {
		s, err := prog.Stats()
		if err != nil {
			return 0, 0, err
		}
		runs += s.RunCount
		total += s.Runtime
	}
	return runs, total, nil
}

// statsMethod is a method whose kernel programs report their statistics.
type statsMethod struct {
	name    string
	collect func() ([]tracer.Flow, error)
	stats   func() (map[string]ProgramRuns, uint64, error)
	close   func() error
}

func (m *statsMethod) Name() string                    { return m.name }
func (m *statsMethod) Collect() ([]tracer.Flow, error) { return m.collect() }
func (m *statsMethod) Close() error                    { return m.close() }

func (m *statsMethod) KernelTime() (uint64, time.Duration, error) {
	progs, _, err := m.stats()
	if err != nil {
		return 0, 0, err
	}
	var runs uint64
	var total time.Duration
	for _, p := range progs {
		runs += p.Count
		total += p.Time
	}
	return runs, total, nil
}

func (m *statsMethod) Losses() uint64 {
	_, lost, err := m.stats()
	if err != nil {
		return 0
	}
	return lost
}

package measure

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/loadgen"
)

// makePair makes a pair again when perf's samples of either run cannot be
// used or the runs cannot be compared, at most pairAttempts times in all;
// any other error ends it at once. The traced side is stopped after every
// traced run.
func TestMakePairRetriesOnlyWhatMayPassNextTime(t *testing.T) {
	unusable := fmt.Errorf("%w: perf's 10 busy samples...", errPerfUnusable)
	broken := errors.New("load process died")
	ok := func(rate float64) pairRun { return pairRun{res: loadgen.Result{Rate: rate}} }
	cases := []struct {
		name      string
		runs      []error // each measure() call's error, in order
		checks    []error // each check's verdict, in order
		startErr  error
		wantErr   string // "" for success
		wantRuns  int
		wantStart int
		wantAgain int // "running the pair again" lines
	}{
		{name: "first pair fine", runs: []error{nil, nil}, checks: []error{nil}, wantRuns: 2, wantStart: 1},
		{name: "untraced perf unusable, then fine", runs: []error{unusable, nil, nil}, checks: []error{nil},
			wantRuns: 3, wantStart: 1, wantAgain: 1},
		{name: "traced perf unusable, then fine", runs: []error{nil, unusable, nil, nil}, checks: []error{nil},
			wantRuns: 4, wantStart: 2, wantAgain: 1},
		{name: "perf unusable three times", runs: []error{unusable, unusable, unusable},
			wantErr: "pair 1, untraced run: perf's samples unusable: perf's 10 busy samples... (3 tries)", wantRuns: 3, wantAgain: 2},
		{name: "short, then traced perf unusable, then unusable again", runs: []error{nil, nil, nil, unusable, unusable},
			checks:  []error{errors.New("short 1")},
			wantErr: "pair 1, untraced run: perf's samples unusable: perf's 10 busy samples... (3 tries)", wantRuns: 5, wantStart: 2, wantAgain: 2},
		{name: "rate short three times", runs: []error{nil, nil, nil, nil, nil, nil},
			checks:  []error{errors.New("short 1"), errors.New("short 2"), errors.New("short 3")},
			wantErr: "short 3 (3 tries)", wantRuns: 6, wantStart: 3, wantAgain: 2},
		{name: "traced run broken", runs: []error{nil, broken},
			wantErr: "pair 1, traced run: load process died", wantRuns: 2, wantStart: 1},
		{name: "untraced run broken", runs: []error{broken},
			wantErr: "pair 1, untraced run: load process died", wantRuns: 1},
		{name: "traced side fails to start", runs: []error{nil}, startErr: errors.New("load tracer: no BTF"),
			wantErr: "load tracer: no BTF", wantRuns: 1, wantStart: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var runs, starts, stops, checks int
			var events []string // starts, stops and progress lines, in order
			measure := func() (pairRun, error) {
				if runs >= len(c.runs) {
					t.Fatalf("run %d: more runs than the case has", runs+1)
				}
				err := c.runs[runs]
				runs++
				return ok(float64(runs)), err
			}
			start := func() (func(), error) {
				starts++
				events = append(events, "start")
				if c.startErr != nil {
					return nil, c.startErr
				}
				return func() { stops++; events = append(events, "stop") }, nil
			}
			check := func(base, traced loadgen.Result) error {
				if traced.Rate != base.Rate+1 {
					t.Errorf("check got runs %v and %v, want the last two", base.Rate, traced.Rate)
				}
				err := c.checks[checks]
				checks++
				return err
			}
			progress := lineLog{events: &events}
			base, traced, err := makePair("paired x, pair 1", measure, start, check, progress)
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				if base.res.Rate != float64(runs-1) || traced.res.Rate != float64(runs) {
					t.Errorf("returned runs %v and %v, want the last two of %d", base.res.Rate, traced.res.Rate, runs)
				}
			} else if err == nil || !strings.HasSuffix(err.Error(), c.wantErr) {
				t.Fatalf("error %v, want one ending %q", err, c.wantErr)
			} else if strings.Contains(c.wantErr, "perf's samples unusable") && !errors.Is(err, errPerfUnusable) {
				t.Errorf("error %v does not wrap errPerfUnusable", err)
			}
			if runs != c.wantRuns || starts != c.wantStart {
				t.Errorf("%d runs and %d starts, want %d and %d", runs, starts, c.wantRuns, c.wantStart)
			}
			if c.startErr == nil && stops != starts {
				t.Errorf("%d starts but %d stops: the traced side was left attached", starts, stops)
			}
			all := strings.Join(events, "\n")
			if n := strings.Count(all, "running the pair again"); n != c.wantAgain {
				t.Errorf("%d retries reported, want %d:\n%s", n, c.wantAgain, all)
			}
			// Each traced run is announced once its side is in place.
			for i, e := range events {
				if strings.HasSuffix(e, ": traced run") && (i == 0 || events[i-1] != "start") {
					t.Errorf("traced run announced before its start:\n%s", all)
				}
			}
			if n, want := strings.Count(all, ": traced run"), starts; c.startErr == nil && n != want {
				t.Errorf("%d traced runs announced, %d started:\n%s", n, want, all)
			}
		})
	}
}

// lineLog appends each line written to it to events.
type lineLog struct{ events *[]string }

func (l lineLog) Write(b []byte) (int, error) {
	*l.events = append(*l.events, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")...)
	return len(b), nil
}

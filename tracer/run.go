package tracer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Run drains every interval and calls emit with the result until ctx is
// done; then it drains once more so the last partial interval is not lost.
// A drain that fails still emits what it read (counts it drained are in the
// interval, never dropped); Run gives up after maxDrainErrors failed drains
// in a row. Run commits each interval when emit returns nil, so an emit
// that must not lose counts (with Config.PinPath) stores the interval
// before returning; an emit that stores asynchronously uses RunWith and
// RunOptions.AsyncCommit. An interval whose commit failed is emitted
// again, with the same BatchID. An error from emit ends Run.
func (t *Tracer) Run(ctx context.Context, emit func(Interval) error) error {
	return t.RunWith(ctx, RunOptions{}, emit)
}

// RunOptions change how RunWith hands intervals over; the zero value is Run.
type RunOptions struct {
	// AsyncCommit: emit hands each interval over (to a goroutine that
	// stores it) and returns at once; whoever stores it then calls exactly
	// one of Interval.Commit, once it is stored, or Interval.Abandon, if it
	// could not be. Until then the drains due are skipped (the kernel keeps
	// counting, and the next drain after it takes everything). When ctx is
	// done, RunWith waits for that call, and drains a last time only if the
	// interval was committed: an abandoned one stays in a pinned kernel
	// side for the next process, and draining again would only repeat it.
	// A Commit's error counts as a failed drain whenever it comes: before
	// emit returned, with that drain (and DrainFailed is told); later, when
	// the next drain is due (the consumer has logged it: DrainFailed is not
	// told again), so that maxDrainErrors failed commits in a row end
	// RunWith either way.
	AsyncCommit bool
	// DrainFailed, when set, is told about each drain that failed (after
	// its interval was emitted), except the last one at stop, whose error
	// RunWith returns.
	DrainFailed func(error)
	// ReuseFlows: emit keeps neither Interval.Flows nor pointers into it
	// once it returns, error or not, so the next interval's flows are
	// built in the same memory (with 2,000 flows an interval, a new slice
	// each time was a megabyte of garbage and page faults;
	// docs/performance.md). A synchronous emit only: RunWith refuses it
	// with AsyncCommit, whose consumer holds the interval past emit.
	ReuseFlows bool
}

// RunWith is Run with options.
func (t *Tracer) RunWith(ctx context.Context, opts RunOptions, emit func(Interval) error) error {
	if opts.ReuseFlows {
		if opts.AsyncCommit {
			return errors.New("RunOptions.ReuseFlows needs a synchronous emit: not allowed with AsyncCommit")
		}
		inner := emit
		emit = func(iv Interval) error {
			err := inner(iv)
			t.reuseFlows(iv.Flows)
			return err
		}
	}
	return runLoop(ctx, t.cfg.Interval, t.Collect, opts, emit)
}

// runLoop is RunWith's loop over any collect, so that its bookkeeping of
// failed drains and handovers is testable without a kernel.
func runLoop(ctx context.Context, interval time.Duration, collect func() (Interval, error), opts RunOptions, emit func(Interval) error) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var prev *handover     // the interval the consumer holds (AsyncCommit)
	prevCollected := false // prev's drain itself succeeded
	failed := 0
	last := false
	for {
		if !last {
			select {
			case <-ctx.Done():
				last = true
			case <-tick.C:
			}
		}
		if prev != nil {
			if last {
				if !prev.wait() {
					return nil // a pinned kernel side keeps it; collecting again would only repeat it
				}
			} else if !prev.settled() {
				continue // not stored yet: this drain waits for the next tick
			}
			// Settled: its drain counts as failed if its late commit did.
			if late := prev.late(); late != nil && prevCollected {
				if failed++; failed >= maxDrainErrors {
					return fmt.Errorf("%d drains in a row failed, the last: commit: %w", failed, late)
				}
			} else if prevCollected {
				failed = 0
			}
			prev = nil
		}
		iv, err := collect()
		var emitErr error
		if opts.AsyncCommit {
			prev = newHandover(&iv)
			emitErr = emit(iv)
			err = errors.Join(err, prev.emitted())
			prevCollected = err == nil
		} else {
			emitErr = emit(iv)
			if emitErr == nil {
				err = errors.Join(err, iv.Commit())
			}
		}
		if last {
			if iv.Recovered && err == nil && emitErr == nil {
				continue // a previous process's interval came first: now the last one
			}
			return errors.Join(err, emitErr)
		}
		if emitErr != nil {
			return emitErr
		}
		if err == nil {
			if !opts.AsyncCommit {
				failed = 0 // async: once its commit settles (above)
			}
			continue
		}
		if opts.DrainFailed != nil {
			opts.DrainFailed(err)
		}
		if failed++; failed >= maxDrainErrors {
			return fmt.Errorf("%d drains in a row failed, the last: %w", failed, err)
		}
	}
}

// maxDrainErrors is how many failed drains in a row end Run.
const maxDrainErrors = 3

// handover follows one interval emitted in AsyncCommit mode until the
// consumer commits or abandons it.
type handover struct {
	mu        sync.Mutex
	done      chan struct{} // closed by the first Commit or Abandon
	committed bool
	returned  bool  // emit returned
	syncErr   error // a Commit's error before emit returned
	lateErr   error // a Commit's error after
}

// newHandover makes iv's Commit and Abandon report to the handover.
func newHandover(iv *Interval) *handover {
	h := &handover{done: make(chan struct{})}
	commit := iv.commit
	iv.commit = func() error {
		var err error
		if commit != nil {
			err = commit()
		}
		h.finish(err == nil, err)
		return err
	}
	iv.abandon = func() { h.finish(false, nil) }
	return h
}

func (h *handover) finish(committed bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.done:
		return // the first call decides
	default:
	}
	h.committed = committed
	if !h.returned {
		h.syncErr = err
	} else {
		h.lateErr = err
	}
	close(h.done)
}

// late is the error of a Commit made after emit returned.
func (h *handover) late() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lateErr
}

// emitted marks the return of emit and returns the error of a Commit
// made before it.
func (h *handover) emitted() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.returned = true
	return h.syncErr
}

func (h *handover) settled() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// wait blocks until the consumer is done and reports whether it committed.
func (h *handover) wait() bool {
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.committed
}

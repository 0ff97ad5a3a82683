package dnswatch

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/tracer"
)

// Config configures a Watcher.
type Config struct {
	// NetNS, when not 0, keeps only the DNS messages of that namespace.
	NetNS uint32
	// Timeout is how long a query waits for its answer before it is
	// counted as timed out.
	Timeout time.Duration
	// Grace is how long past its TTL an answer still names its
	// addresses (clients connect after the answer, some cache it).
	Grace time.Duration
	// MaxNames bounds the addresses named at once, over every namespace.
	MaxNames int
	// Variant names the programs to load (one of Variants); "" loads the
	// per-call variant where Calls offers its hooks, and otherwise the
	// first per-packet variant that the kernel accepts.
	Variant string
	// Calls, when set, is the tracer whose send and receive programs
	// hand each call on a possible resolver's socket to the per-call
	// programs, and whose sendmsg programs note resolvers for whichever
	// variant loads (tracer.Tracer.DNSCallHooks). Without it the per-call
	// programs, when named, are attached to the tracepoints on their own,
	// which costs more (docs/performance.md, "DNS watching"), and the
	// watcher notes resolvers with sendmsg programs of its own.
	Calls CallHooks
}

// CallHooks gives the program arrays the per-call programs go in (the
// send and receive ones; ok is false when the tracer has none on this
// kernel) and the resolver notes the tracer's sendmsg programs write
// (dests: whichever variant loads reads them in place of its own, and the
// watcher's sendmsg programs are not loaded; nil: the watcher notes
// resolvers itself). *tracer.Tracer is one.
type CallHooks interface {
	DNSCallHooks() (send, recv, dests *ebpf.Map, ok bool)
}

// Defaults and bounds of Config.
const (
	DefaultTimeout  = 5 * time.Second
	MinTimeout      = 100 * time.Millisecond
	MaxTimeout      = 5 * time.Minute
	DefaultGrace    = 2 * time.Minute
	DefaultMaxNames = 100_000
)

// DefaultConfig is the watcher of every namespace with the defaults.
func DefaultConfig() Config {
	return Config{Timeout: DefaultTimeout, Grace: DefaultGrace, MaxNames: DefaultMaxNames}
}

// Validate names the first bad field and what is allowed.
func (c Config) Validate() error {
	if c.Timeout < MinTimeout || c.Timeout > MaxTimeout {
		return fmt.Errorf("invalid --dns-timeout %s: allowed %s to %s", c.Timeout, MinTimeout, MaxTimeout)
	}
	if c.Grace < 0 {
		return fmt.Errorf("invalid DNS name grace %s: allowed 0 or more", c.Grace)
	}
	if c.MaxNames < 1 {
		return fmt.Errorf("invalid DNS name cache size %d: allowed 1 or more", c.MaxNames)
	}
	if _, ok := lookupVariant(c.Variant); c.Variant != "" && !ok {
		return fmt.Errorf("invalid DNS program variant %q: allowed %s", c.Variant, VariantNames())
	}
	return nil
}

// Watcher captures DNS messages and keeps what they say. Apply hands its
// findings to each interval.
type Watcher struct {
	k     *kernelSide
	links []link.Link
	// handOff are the tracer's program arrays (this watcher's own
	// handles) that hold the per-call programs; empty when they are
	// attached on their own or the variant is a per-packet one.
	handOff []*ebpf.Map
	// handOffIDs are the kernel's IDs of the programs in handOff's
	// arrays, in order: takeBack takes out only its own.
	handOffIDs []ebpf.ProgramID
	// refused says why the per-call programs are not in the tracer's
	// calls though it offered them (nil: they are, or it did not).
	refused  error
	closed   sync.Once
	closeErr error
	rd       *ringbuf.Reader

	mu sync.Mutex // guards st
	st *state

	applyMu sync.Mutex    // one Apply at a time
	flushed chan struct{} // the reader reached a Flush
	done    chan struct{} // the reader stopped
}

// New loads bpf/dns.bpf.c, attaches its programs (the per-call ones in
// the tracer's program arrays or to their tracepoints, the rest at the
// cgroup v2 root) and starts reading.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := kernel.Prepare(); err != nil {
		return nil, err
	}
	root, err := kernel.CgroupV2Root()
	if err != nil {
		return nil, fmt.Errorf("dns: %w", err)
	}
	w := &Watcher{st: newState(cfg), flushed: make(chan struct{}, 1), done: make(chan struct{})}
	// dests: the tracer's resolver notes, which every variant reads in
	// place of its own (nil: the watcher notes resolvers itself), so no
	// second program runs on the tracer's sendmsg hooks.
	var send, recv, dests *ebpf.Map
	handOff := false
	if cfg.Calls != nil {
		send, recv, dests, handOff = cfg.Calls.DNSCallHooks()
		handOff = handOff && (cfg.Variant == "" || cfg.Variant == perCallName)
	}
	name := cfg.Variant
	if name == "" && handOff {
		name = perCallName
	}
	if w.k, _, err = load(name, dests); err != nil && cfg.Variant == "" && name != "" {
		// The per-call programs refused (no task storage, say): the
		// per-packet ones see the same lookups.
		w.refused = err
		if w.k, _, err = load("", dests); err != nil {
			return nil, errors.Join(w.refused, err)
		}
	}
	if err != nil {
		return nil, err
	}
	if w.k.variant.PerCall && handOff {
		if err := w.handOver(send, recv); err != nil {
			if cfg.Variant != "" {
				_ = w.k.Close() // the hand-over's error is the one to report
				return nil, err
			}
			// The kernel refused the programs in the tracer's arrays
			// (its rules on tail calls, say): the per-packet ones see
			// the same lookups.
			w.refused = err
			_ = w.k.Close() // replaced; nothing of it runs
			if w.k, _, err = load("", dests); err != nil {
				return nil, errors.Join(w.refused, err)
			}
		}
	} else if w.k.variant.PerCall {
		// The tracepoints see every socket of the machine; the cgroup
		// hooks below note the sendto()s to port 53.
		for _, p := range []*ebpf.Program{w.k.egress, w.k.ingress} {
			l, err := link.AttachTracing(link.TracingOptions{Program: p})
			if err != nil {
				_ = w.close() // the attach error is the one to report
				return nil, fmt.Errorf("dns: attach %s: %w", p, err)
			}
			w.links = append(w.links, l)
		}
	}
	for _, a := range []struct {
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{
		{w.k.egress, ebpf.AttachCGroupInetEgress}, {w.k.ingress, ebpf.AttachCGroupInetIngress},
		{w.k.sendmsg4, ebpf.AttachCGroupUDP4Sendmsg}, {w.k.sendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
	} {
		if a.prog == nil || w.k.variant.PerCall && (a.prog == w.k.egress || a.prog == w.k.ingress) {
			continue // not loaded (the tracer's note resolvers; or Variant.Lost says so), or attached above
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: root, Attach: a.attach, Program: a.prog})
		if err != nil {
			_ = w.close() // the attach error is the one to report
			return nil, fmt.Errorf("dns: attach %s at %s: %w", a.attach, root, err)
		}
		w.links = append(w.links, l)
	}
	if w.rd, err = ringbuf.NewReader(w.k.events); err != nil {
		_ = w.close() // the ring buffer error is the one to report
		return nil, fmt.Errorf("dns: ring buffer: %w", err)
	}
	go w.read()
	return w, nil
}

// handOver puts the per-call programs in the tracer's program arrays,
// through handles of the watcher's own (the tracer may release its maps,
// a pinned side left counting, before this watcher takes its programs
// out); on failure it takes out what it put, and w.handOff is empty.
func (w *Watcher) handOver(send, recv *ebpf.Map) error {
	for _, a := range []struct {
		calls *ebpf.Map
		prog  *ebpf.Program
	}{{send, w.k.egress}, {recv, w.k.ingress}} {
		var id ebpf.ProgramID
		info, err := a.prog.Info()
		if err == nil {
			var ok bool
			if id, ok = info.ID(); !ok {
				err = errors.New("the kernel gives no program IDs")
			}
		}
		var m *ebpf.Map
		if err == nil {
			m, err = a.calls.Clone()
		}
		if err == nil {
			w.handOff = append(w.handOff, m)
			w.handOffIDs = append(w.handOffIDs, id)
			err = m.Put(uint32(0), a.prog)
		}
		if err != nil {
			_ = w.takeBack() // the hand-over's error is the one to report
			return fmt.Errorf("dns: hand %s to the tracer's calls: %w", a.prog, err)
		}
	}
	return nil
}

// takeBack takes the per-call programs out of the tracer's arrays, so its
// calls fall through again, unless another watcher has put its own there
// since (a pinned side adopted by the next agent while this one was
// ending: the agents' lock keeps two from running at once, so the check
// and the delete need not be one step), and closes the handles.
func (w *Watcher) takeBack() error {
	var errs []error
	for i, m := range w.handOff {
		// A program array's slot reads as the program's ID.
		var id uint32
		if m.Lookup(uint32(0), &id) == nil && ebpf.ProgramID(id) == w.handOffIDs[i] {
			if err := m.Delete(uint32(0)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("dns: take the per-call program out of %s: %w", m, err))
			}
		}
		errs = append(errs, m.Close())
	}
	w.handOff, w.handOffIDs = nil, nil
	return errors.Join(errs...)
}

// read takes records as the kernel side hands them over. The kernel side
// wakes the reader only when a quarter of the ring waits (bpf/dns.bpf.c),
// so a busy resolver costs one wakeup per batch, not one per packet, and
// Apply flushes first, so no interval misses a packet. There is no timer:
// records carry the kernel's timestamps, so reading them late changes no
// latency or timeout, and an idle host never wakes the reader (a read
// every 100 ms was about a third of an idle agent's CPU).
func (w *Watcher) read() {
	defer close(w.done)
	var rec ringbuf.Record
	var e Event
	for {
		err := w.rd.ReadInto(&rec)
		switch {
		case err == nil:
			if decodeEvent(rec.RawSample, &e) != nil {
				continue
			}
			now := clockNow()
			w.mu.Lock()
			w.st.handle(&e, now)
			w.mu.Unlock()
		case errors.Is(err, ringbuf.ErrFlushed):
			select {
			case w.flushed <- struct{}{}:
			default:
			}
		case errors.Is(err, os.ErrClosed), errors.Is(err, ringbuf.ErrClosed):
			return
		default:
			// A read error other than closing: retry after a pause
			// rather than spin.
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func clockNow() clock {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail on Linux
	return clock{wall: time.Now(), mono: uint64(ts.Nano())}
}

// Apply reads every DNS packet the kernel side has handed over so far,
// then names iv's outbound tcp and udp flows (RemoteName) and appends to
// iv.DNS each client's lookups since the last Apply. Identity is left
// for the caller to fill from CgroupID.
func (w *Watcher) Apply(iv *tracer.Interval) {
	w.applyMu.Lock()
	defer w.applyMu.Unlock()
	// A token left by the flush of an Apply that stopped waiting would
	// let this one go on before its own flush is read.
	select {
	case <-w.flushed:
	default:
	}
	if err := w.rd.Flush(); err == nil {
		select {
		case <-w.flushed:
		case <-w.done:
		case <-time.After(time.Second):
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.st.apply(iv, clockNow())
}

// Stats returns the watcher's counters since it started, with what the
// kernel side lost.
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	s := w.st.stats
	w.mu.Unlock()
	var per []uint64
	sum := func(idx dnsDnsStat) uint64 {
		var n uint64
		if err := w.k.stats.Lookup(uint32(idx), &per); err == nil {
			for _, v := range per {
				n += v
			}
		}
		return n
	}
	s.Lost = sum(dnsDnsStatDNS_STAT_RINGBUF_FULL) + sum(dnsDnsStatDNS_STAT_BUSY)
	if w.k.variant.PerCall && len(w.handOff) == 0 {
		// Runs the kernel skipped because the same program was running
		// on this CPU (preempted, from 6.19): calls of any socket, so
		// at most this many DNS calls were not seen. (Handed a call by
		// the tracer, the programs run inside the tracer's, whose
		// copies against recursion cover them.)
		for _, p := range []*ebpf.Program{w.k.egress, w.k.ingress} {
			if ps, err := p.Stats(); err == nil {
				s.Skipped += ps.RecursionMisses
			}
		}
	}
	s.Unreadable = sum(dnsDnsStatDNS_STAT_UNREADABLE)
	return s
}

// Variant is the pair of programs the kernel loaded.
func (w *Watcher) Variant() Variant { return w.k.variant }

// HandOffRefused says why the per-call programs are not in the tracer's
// calls though it offered them: they did not load, or the kernel refused
// them in its arrays (a per-packet variant runs instead); nil when they
// are, or when it did not offer them.
func (w *Watcher) HandOffRefused() error { return w.refused }

// OwnNotes says whether the watcher loaded (and so attached) its own
// sendmsg programs, which note resolvers; with a tracer whose sendmsg
// programs are attached it reads the tracer's notes instead.
func (w *Watcher) OwnNotes() bool {
	return w.k.sendmsg4 != nil || w.k.sendmsg6 != nil
}

// HandedOff reports whether the per-call programs run inside the tracer's
// send and receive programs (Config.Calls), not attached on their own.
func (w *Watcher) HandedOff() bool { return len(w.handOff) > 0 }

// Close detaches the programs and stops reading.
func (w *Watcher) Close() error {
	w.closed.Do(func() {
		w.closeErr = w.close()
		<-w.done
	})
	return w.closeErr
}

func (w *Watcher) close() error {
	var errs []error
	if w.rd != nil {
		errs = append(errs, w.rd.Close())
	} else {
		close(w.done)
	}
	for _, l := range w.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, w.takeBack())
	errs = append(errs, w.k.Close())
	return errors.Join(errs...)
}

// ProgramStats are the kernel's run count and run time of the watcher's
// two programs (egress and ingress, summed): the run time only counts
// while kernel.bpf_stats_enabled is on. Programs handed calls by the
// tracer (HandedOff) count none: their runs are the tracer's.
func (w *Watcher) ProgramStats() (runs uint64, runtime time.Duration, err error) {
	for _, p := range []*ebpf.Program{w.k.egress, w.k.ingress} {
		s, err := p.Stats()
		if err != nil {
			return 0, 0, err
		}
		runs += s.RunCount
		runtime += s.Runtime
	}
	return runs, runtime, nil
}

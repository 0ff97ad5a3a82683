// Package agent runs the tracer continuously and writes what it sees into
// a store: one batch per interval, spooled to disk while the store is
// unreachable so that nothing collected is lost.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/internal/hooks"
	"github.com/deptrace/deptrace/internal/metrics"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// Config configures an agent.
type Config struct {
	Tracer tracer.Config
	Store  string // see store.Open
	// Retention bounds the history per level (a zero window keeps that
	// level for ever); StoreMaxSize (bytes, 0: none) is the store's size
	// ceiling, past which the oldest buckets go first. Both are applied
	// at most once a minute, after a write.
	Retention    store.Retention
	StoreMaxSize int64
	SpoolPath    string
	SpoolMax     int64 // bytes
	// BufferMax bounds the batches kept in memory (estimated bytes)
	// while neither the store nor the spool can be written (a full
	// disk): the newest are kept, the oldest dropped and counted. 0 keeps
	// none.
	BufferMax int64
	HostID    string // id of this machine's root namespace; default hostname
	// MetricsListen is where /metrics is served; "" disables metrics.
	MetricsListen string
	Metrics       metrics.Options
	// KeepTracing leaves a pinned kernel side (Tracer.PinPath) attached
	// and counting when the agent stops, for the next agent to adopt.
	KeepTracing bool
	// Annotate, when set, fills each interval's flows' Identity (unit,
	// container, pod) before they are counted and stored.
	Annotate func([]tracer.Flow)
	// DNS, when set, names each interval's outbound flows (RemoteName)
	// and fills its DNS records (with their Identity) before they are
	// counted and stored: the DNS watcher's Apply.
	DNS func(*tracer.Interval)
	// Loaded, when set, runs once the tracer is loaded and before the
	// first drain (the DNS watcher starts there, to take the tracer's
	// calls); the stop it returns, if any, runs before the tracer is
	// closed or released.
	Loaded  func(*tracer.Tracer) (stop func())
	EdgeCap // MaxEdgesPerNode: folds a local end's flows past it (fold.go)
	// MaxProcs is Go's GOMAXPROCS for the agent unless the environment
	// sets it; 0 leaves Go's default (one per CPU, or the container's
	// CPU limit). See DefaultMaxProcs.
	MaxProcs int
}

// goRuntimeAttrs are the "go runtime" line's values, each with where it
// came from: the environment's GOMAXPROCS, GOGC or GOMEMLIMIT where Go
// took it (maxProcs and gcTargets then left it alone: percent or limit
// -1), else what deptrace set and why, or Go's default.
func goRuntimeAttrs(procs, wantProcs, percent int, limit int64, lookupEnv func(string) (string, bool)) []any {
	attrs := []any{"gomaxprocs", procs}
	switch {
	case goTakes(lookupEnv, "GOMAXPROCS"):
		attrs = append(attrs, "gomaxprocs_from", "GOMAXPROCS")
	case wantProcs > 0:
		attrs = append(attrs, "gomaxprocs_from", "--gomaxprocs (default 1: the agent's work is one pipeline)")
	default:
		attrs = append(attrs, "gomaxprocs_from", "Go's default (--gomaxprocs 0)")
	}
	if percent < 0 {
		v, _ := lookupEnv("GOGC")
		attrs = append(attrs, "gc_percent", v, "gc_percent_from", "GOGC")
	} else {
		attrs = append(attrs, "gc_percent", percent, "gc_percent_from", "deptrace (an interval's flows die young: less CPU for a little more memory)")
	}
	if limit < 0 {
		v, _ := lookupEnv("GOMEMLIMIT")
		return append(attrs, "memory_limit", v, "memory_limit_from", "GOMEMLIMIT")
	}
	return append(attrs, "memory_limit_mib", limit>>20, "memory_limit_from", "deptrace (the Go part of its memory ceiling: docs/operations.md, Memory)")
}

// DefaultSpoolPath is where batches wait while the store is unreachable.
const DefaultSpoolPath = "/var/lib/deptrace/spool.jsonl"

// Defaults of the bounds on what the agent keeps.
const (
	DefaultStoreMaxSize = 4 << 30  // 4 GiB
	DefaultBufferMax    = 64 << 20 // 64 MiB
)

// Run traces and stores until ctx is done, then flushes the last interval.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	halt, err := testHaltPoint()
	if err != nil {
		return err
	}
	// Refused before anything is loaded: a store that can never be
	// opened would leave the agent spooling for ever.
	if err := store.CheckSpec(cfg.Store); err != nil {
		return err
	}
	series := 0
	if cfg.MetricsListen != "" {
		series = cfg.Metrics.MaxSeries
		if series <= 0 {
			series = metrics.DefaultMaxSeries // as metrics.New takes it
		}
	}
	if procs := maxProcs(cfg.MaxProcs, os.LookupEnv); procs > 0 {
		runtime.GOMAXPROCS(procs)
	}
	memLimit := memoryLimit{base: -1}
	if cpus, err := ebpf.PossibleCPU(); err == nil {
		percent, limit := gcTargets(cfg.Tracer.FlowMapSize, cpus, series, cfg.BufferMax, cfg.Tracer.PinPath != "", os.LookupEnv)
		setGC(percent, limit)
		memLimit.base = limit
		log.Info("go runtime", goRuntimeAttrs(runtime.GOMAXPROCS(0), cfg.MaxProcs, percent, limit, os.LookupEnv)...)
	}
	var m *metrics.Metrics // nil: metrics off, every call a no-op
	if cfg.MetricsListen != "" {
		cfg.Metrics.FlowMapSize = cfg.Tracer.FlowMapSize
		m = metrics.New(cfg.Metrics)
		sctx, stopServing := context.WithCancel(ctx) // also when Run fails
		defer stopServing()
		addr, err := m.Serve(sctx, cfg.MetricsListen, log)
		if err != nil {
			return err
		}
		log.Info("metrics served", "url", "http://"+addr.String()+"/metrics")
	}
	st, err := store.Open(ctx, cfg.Store)
	storeErr := err
	if err != nil {
		// Unreachable at start is not fatal: bundle, spool, retry.
		log.Warn("store unreachable; spooling until it answers", "store", cfg.Store, "err", err)
	}
	t, err := tracer.New(cfg.Tracer)
	if err != nil {
		if st != nil {
			_ = st.Close() // the tracer's error is the one to report
		}
		return err
	}
	var runErr error // set when tracing stops on an error
	defer func() {
		// A clean stop detaches; a failure leaves a pinned kernel side
		// counting for the agent that restarts (Restart=on-failure).
		if cfg.KeepTracing || (runErr != nil && cfg.Tracer.PinPath != "") {
			t.Release()
			log.Info("kernel side left attached and counting for the next agent", "pin_path", cfg.Tracer.PinPath)
			return
		}
		if err := t.Close(); err != nil {
			log.Warn("removing the pinned kernel side", "pin_path", cfg.Tracer.PinPath, "err", err)
			return
		}
		if runErr == nil {
			// An operator reading the journal sees the stop was clean.
			log.Info("agent stopped; kernel side detached", "pin_path", cfg.Tracer.PinPath)
		}
	}()
	if cfg.Loaded != nil {
		if stop := cfg.Loaded(t); stop != nil {
			defer stop() // before the tracer's own deferred close, above
		}
	}
	if ad := t.Adoption(); ad.MountedBPFFS {
		log.Info("mounted bpffs for the pinned kernel side", "path", cfg.Tracer.PinPath)
	}
	switch ad := t.Adoption(); {
	case ad.Adopted:
		log.Info("adopted the kernel side a previous agent left counting", "pin_path", cfg.Tracer.PinPath)
	case ad.Replaced != "":
		log.Warn("replaced a pinned kernel side", "pin_path", cfg.Tracer.PinPath, "why", ad.Replaced,
			"flows_salvaged", ad.Salvaged, "entries_lost", ad.Unreadable)
	}
	hooks.LogUncovered(log, t.Hooks())
	hooks.LogMissingCapabilities(log, cfg.Tracer.PinPath != "")

	ids, err := newHostIDs(cfg.HostID)
	if err != nil {
		return err
	}
	w := &writer{cfg: cfg, log: log, store: st, spool: &spool{path: cfg.SpoolPath, max: cfg.SpoolMax}, failing: storeErr != nil, failLogged: storeErr != nil, storeErr: storeErr, metrics: m, halt: halt}
	log.Info("agent started", "store", cfg.Store, "store_reachable", storeErr == nil, "interval", cfg.Tracer.Interval, "host", ids.rootID,
		"retention_minutes", keptFor(cfg.Retention.Minutes), "retention_hours", keptFor(cfg.Retention.Hours), "retention_days", keptFor(cfg.Retention.Days),
		"store_max_size_bytes", cfg.StoreMaxSize)

	// The writer stores one interval at a time and commits it in the
	// kernel once it is in the store or the spool (or abandons it); until
	// then the next drain waits (the kernel keeps counting).
	jobs := make(chan job, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.loop(jobs)
	}()

	hostID := func(ns uint32) string { return ids.host(ns).ID }
	servicesDue := 0 // intervals until listening services are written again
	in := &intake{cfg: &cfg, log: log, metrics: m, host: hostID, memLimit: &memLimit}
	emit := func(iv tracer.Interval) error {
		ids.nextDrain()
		ids.nameInterval(&iv)
		in.take(&iv)
		b := batchOf(iv, ids)
		if servicesDue <= 0 && !iv.Recovered { // listening services change slowly
			if ports, err := t.ListeningPorts(); err == nil {
				for _, p := range ports {
					proto := tracer.ProtoTCP
					if p.Proto == tracer.ProtoUDP {
						proto = tracer.ProtoUDP
					}
					b.Services = append(b.Services, store.Service{HostID: ids.host(p.NetNS).ID, Proto: string(proto), Port: p.Port, Comm: p.Comm, LastSeen: iv.Time})
				}
			}
			servicesDue = 30
		}
		servicesDue--
		if len(b.Observations)+len(b.Services)+len(b.Listeners)+len(b.DNS) == 0 {
			// Nothing to store: committed here, its error a failed drain.
			_ = iv.Commit()
			return nil
		}
		jobs <- job{batch: b, iv: iv}
		return nil
	}
	runErr = t.RunWith(ctx, tracer.RunOptions{
		AsyncCommit: true,
		DrainFailed: func(err error) { log.Warn("drain failed", "err", err) },
	}, emit)
	cfg.EdgeCap.logFolded(log) // what was folded since the last once-a-minute line
	close(jobs)
	wg.Wait()
	if n := len(w.held); n > 0 {
		log.Error("batches kept in memory could not be written before stopping: lost", "batches", n, "store", cfg.Store, "spool", cfg.SpoolPath)
	}
	if w.store != nil {
		if err := w.store.Close(); err != nil {
			log.Warn("close the store", "store", cfg.Store, "err", err)
		}
	}
	if w.uncommitted && cfg.Tracer.PinPath != "" && runErr == nil {
		// Closing would destroy the counts the store did not take.
		runErr = errors.New("the last interval could not be stored: the kernel side stays pinned for the next agent")
	}
	return runErr
}

// intake readies each drained interval for the metrics and the store,
// in Run's emit: it names the flows and DNS records, folds the flows past
// the cap on edges per local end, and has the metrics count the
// interval the first time its batch is seen.
type intake struct {
	cfg      *Config
	log      *slog.Logger
	metrics  *metrics.Metrics
	host     func(netns uint32) string // a namespace's host id, as the store names it
	memLimit *memoryLimit
	observed observedBatches // what the metrics counted
	again    bool            // the last drain collected an interval again
	dns      dnsBatches
}

func (in *intake) take(iv *tracer.Interval) {
	cfg, log, m := in.cfg, in.log, in.metrics
	if cfg.Annotate != nil {
		cfg.Annotate(iv.Flows)
	}
	if cfg.DNS != nil {
		cfg.DNS(iv)
		in.dns.attach(iv)
	}
	// The flows the drain read from the kernel map: the drain's metrics
	// (and the map's fill) count these, not what the cap leaves of them.
	read := len(iv.Flows)
	cfg.EdgeCap.fold(iv, log, m, in.host) // before the metrics and the store see the flows
	if in.memLimit != nil {
		in.memLimit.follow(cfg.EdgeCap.held())
	}
	if iv.Recovered {
		// While the disk is full this repeats every drain: logged once.
		lvl := slog.LevelInfo
		if in.again {
			lvl = slog.LevelDebug
		}
		log.Log(context.Background(), lvl, "collected again an interval that was not stored and committed", "batch", iv.BatchID, "flows", read)
	}
	in.again = iv.Recovered
	log.Debug("interval drained", "flows", read, "flows_after_cap", len(iv.Flows), "listeners", len(iv.Listeners), "took", iv.Drain, "batch", iv.BatchID)
	if in.observed.first(iv.BatchID) {
		m.ObserveDrained(*iv, read, in.host, iv.Drain)
		m.ObserveListeners(iv.Listeners, in.host)
		if l := iv.Lost; l.Total() > 0 {
			log.Warn("events lost this interval", lostAttrs(l, cfg.Tracer)...)
		}
	}
}

// keptFor names a retention window for the log: 0 keeps for ever.
func keptFor(d time.Duration) string {
	switch {
	case d == 0:
		return "forever"
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d" // as the flags take it: 400d, not 9600h0m0s
	}
	return d.String()
}

// batchOf turns an interval into a store batch named by its BatchID, so
// that the same interval stored twice (collected again after a crash, or
// replayed from the spool) counts once.
func batchOf(iv tracer.Interval, ids *hostIDs) store.Batch {
	b := store.Batch{ID: iv.BatchID, Observations: make([]store.Observation, 0, len(iv.Flows))}
	seen := map[uint32]string{} // each namespace named once a batch
	host := func(ns uint32) string {
		if id, ok := seen[ns]; ok {
			return id
		}
		h := ids.host(ns)
		seen[ns] = h.ID
		b.Hosts = append(b.Hosts, store.Host{ID: h.ID, Name: h.Name, NetNS: ns, Addrs: h.Addrs, LastSeen: iv.Time})
		return h.ID
	}
	for _, f := range iv.Flows {
		b.Observations = append(b.Observations, Observation(host(flowNetNS(f, ids.rootNS)), f, store.DefaultBucket))
	}
	for _, l := range iv.Listeners {
		b.Listeners = append(b.Listeners, Listener(host(l.NetNS), l, store.DefaultBucket))
	}
	for _, d := range iv.DNS {
		b.DNS = append(b.DNS, DNSObservation(host(d.NetNS), d, store.DefaultBucket))
	}
	return b
}

// DNSObservation turns one client's DNS record, seen on host, into a
// stored DNS observation.
func DNSObservation(host string, d tracer.DNS, bucket time.Duration) store.DNSObservation {
	return store.DNSObservation{
		Bucket: d.Time.Truncate(bucket), HostID: host, Comm: d.Comm, PID: d.PID, Identity: d.Identity,
		Proto: string(d.Proto), Resolver: d.Resolver, DNSCounters: d.DNSCounters, FirstSeen: d.Time, LastSeen: d.Time,
	}
}

// observedBatches says which intervals the metrics count: each batch id
// once (an interval collected again is not counted again, even after a
// failed drain in between), and every interval without one (a failed
// drain's: listeners and losses only).
type observedBatches struct{ last string }

func (o *observedBatches) first(batch string) bool {
	if batch == "" {
		return true
	}
	if batch == o.last {
		return false
	}
	o.last = batch
	return true
}

// dnsBatches decides which DNS records an interval is stored with. They
// come from this process, not from the kernel side, so a store that
// applies each batch id once would drop the lookups of an interval
// collected again (Recovered) that it had stored before: by a process
// that died before the commit, or by this one whose commit failed. Such
// an interval carries exactly the records this process gave it the first
// time, if any; the lookups taken since wait for the next interval that
// is not collected again. A failed drain's interval (no batch id, never
// deduplicated) takes them, but is not one to give its records again.
type dnsBatches struct {
	last      []tracer.DNS // the records given to the last new interval
	lastBatch string
	carry     []tracer.DNS // lookups taken with recovered intervals, not stored yet
}

// attach sets iv.DNS, which holds the lookups taken since the last call.
func (d *dnsBatches) attach(iv *tracer.Interval) {
	if iv.Recovered && iv.BatchID != "" {
		d.carry = mergeDNS(d.carry, iv.DNS)
		iv.DNS = nil
		if iv.BatchID == d.lastBatch {
			iv.DNS = d.last
		}
		return
	}
	iv.DNS = mergeDNS(d.carry, iv.DNS)
	d.carry = nil
	if iv.BatchID != "" {
		d.last, d.lastBatch = iv.DNS, iv.BatchID
	}
}

// mergeDNS adds b's records into a copy of a, one record per client and
// resolver.
func mergeDNS(a, b []tracer.DNS) []tracer.DNS {
	type key struct {
		netns, pid uint32
		comm       string
		cgroup     uint64
		id         tracer.Identity
		proto      tracer.Proto
		resolver   string
	}
	out := append([]tracer.DNS(nil), a...)
	at := map[key]int{}
	for i, d := range out {
		at[key{d.NetNS, d.PID, d.Comm, d.CgroupID, d.Identity, d.Proto, d.Resolver}] = i
	}
	for _, d := range b {
		k := key{d.NetNS, d.PID, d.Comm, d.CgroupID, d.Identity, d.Proto, d.Resolver}
		if i, ok := at[k]; ok {
			out[i].DNSCounters.Add(d.DNSCounters)
			out[i].Time = d.Time
			continue
		}
		at[k] = len(out)
		out = append(out, d)
	}
	return out
}

// testHaltEnv names a test hook: the agent stops dead at one point of
// storing its first non-empty interval, logs "halted for a test" and
// waits to be killed. Values: "collected" (the interval is read from the
// kernel, not yet stored) and "stored" (stored or spooled, not yet
// committed in the kernel). Tests use it to kill the agent with SIGKILL
// exactly there.
const testHaltEnv = "DEPTRACE_TEST_HALT"

func testHaltPoint() (string, error) {
	switch v := os.Getenv(testHaltEnv); v {
	case "", "collected", "stored":
		return v, nil
	default:
		return "", fmt.Errorf("invalid %s %q: allowed collected, stored", testHaltEnv, v)
	}
}

// Observation turns one flow seen on host into a stored observation. For
// unix flows the addresses are socket paths and the peer process is kept:
// outbound, RemoteAddr is the server's socket and PeerComm the server;
// inbound, LocalAddr is the socket and PeerComm the client.
func Observation(host string, f tracer.Flow, bucket time.Duration) store.Observation {
	return store.Observation{
		Bucket: f.Time.Truncate(bucket), HostID: host, Direction: string(f.Direction), Proto: string(f.Proto),
		LocalAddr: f.LocalAddr, RemoteAddr: f.RemoteAddr, Port: f.Port, Comm: f.Comm, PID: f.PID,
		PeerPID: f.PeerPID, PeerComm: f.PeerComm, RemoteName: f.RemoteName, Identity: f.Identity, Counters: f.Counters,
		FirstSeen: f.FirstSeen, LastSeen: f.LastSeen,
	}
}

// flowNetNS is the namespace whose host a flow belongs to. A unix socket
// with a path lives in the file system, not in a network namespace: both
// ends of it are on the machine, so its flows go to the root namespace's
// host whichever namespace the process is in. Abstract names ("@name")
// are per network namespace and stay there.
func flowNetNS(f tracer.Flow, root uint32) uint32 {
	if f.IsUnix() && !strings.HasPrefix(f.Server(), "@") {
		return root
	}
	return f.NetNS
}

// Listener turns one listening socket's interval record, seen on host,
// into a stored listener.
func Listener(host string, l tracer.Listener, bucket time.Duration) store.Listener {
	return store.Listener{
		Bucket: l.Time.Truncate(bucket), HostID: host, Proto: string(l.Proto), LocalAddr: l.LocalAddr, Port: l.Port,
		PID: l.PID, Comm: l.Comm, BacklogLimit: l.BacklogLimit, QueueMax: l.QueueMax, Drops: l.Drops,
		FirstSeen: l.Time, LastSeen: l.Time,
	}
}

// writer owns the store connection and the spool.
type writer struct {
	cfg        Config
	log        *slog.Logger
	store      *store.Store
	compactErr string // the store's last background compaction error, as logged
	spool      *spool
	failing    bool // the store's last write failed
	failLogged bool // and that was logged (while the spool took the batches)
	// held are the newest batches neither the store nor the spool could
	// take, oldest first, heldBytes their estimated size; holding is set
	// (and logged, once) from the first such batch until held is written.
	held        []heldBatch
	heldBytes   int64
	holding     bool
	heldWritten int    // batches written from memory since holding began
	heldDropped int    // batches dropped since holding began
	heldRetries int    // drains the kernel kept the interval for (pinned)
	dropped     uint64 // batches dropped for good, ever
	storeErr    error  // the store's last write error
	spoolErr    error  // the spool's last error
	lastRetain  time.Time
	// blockedLogged: when the store over its ceiling with nothing the
	// ceiling may delete was last logged (zero: not blocked).
	blockedLogged time.Time
	clock         func() time.Time // retention's; nil: time.Now
	retainDue     bool             // a batch reached the store: retention runs after its commit
	metrics       *metrics.Metrics
	halt          string // see testHaltEnv
	// uncommitted: the last interval is neither stored nor spooled, or
	// its commit failed; a pinned kernel side still holds it.
	uncommitted bool
}

// job is one interval to store as batch; its Commit releases its counts
// in the kernel once they are stored.
type job struct {
	batch store.Batch
	iv    tracer.Interval
}

// loop stores jobs one at a time, committing each once it is durable (in
// the store, or in the spool), and abandoning it otherwise.
func (w *writer) loop(jobs <-chan job) {
	retry := time.NewTicker(5 * time.Second)
	defer retry.Stop()
	for {
		select {
		case j, ok := <-jobs:
			if !ok {
				w.flush()
				return
			}
			w.store1(j)
		case <-retry.C:
			w.idle()
		}
		w.metrics.SetSpool(w.spool.size(), w.spool.dropped)
		w.metrics.SetBuffer(len(w.held), w.heldBytes, w.dropped)
	}
}

// idle runs every 5 s between intervals: what waits is written, and
// retention and the size ceiling run (at most once a minute, as after a
// batch) while the store answers, so that an agent with nothing to store
// still keeps them, and their gauges, up to date.
func (w *writer) idle() {
	w.flush()
	if w.store != nil && w.storeErr == nil && !w.spool.pending() && len(w.held) == 0 {
		w.retain()
	}
}

func (w *writer) store1(j job) {
	w.haltAt("collected")
	if !w.write(j.batch) {
		// Not durable: a pinned kernel side keeps the interval, and the
		// next drain collects it again.
		w.uncommitted = true
		j.iv.Abandon()
		return
	}
	w.haltAt("stored")
	if err := j.iv.Commit(); err != nil {
		w.log.Warn("committing a stored interval in the kernel failed: it will be collected again under its batch id, which the store ignores", "batch", j.batch.ID, "err", err)
		w.uncommitted = true
	} else {
		w.uncommitted = false
	}
	// Retention and the size ceiling can take minutes (a PostgreSQL
	// VACUUM): only once the interval is committed, since the next drain
	// waits for that commit.
	if w.retainDue {
		w.retainDue = false
		w.retain()
		w.logCompaction()
	}
}

// haltAt stops the writer for good at point when the test hook asks for it.
func (w *writer) haltAt(point string) {
	if w.halt != point {
		return
	}
	w.log.Warn("halted for a test", "point", point, "env", testHaltEnv)
	select {}
}

func (w *writer) connect() bool {
	if w.store != nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := store.Open(ctx, w.cfg.Store)
	if err != nil {
		return false
	}
	w.store = st
	w.log.Info("store reachable", "store", st.String())
	return true
}

// write stores b, or spools it, or keeps it in memory; durable is false
// when it is in none of them. What waits (the spool, then memory) is
// written first, so that batches reach the store in order.
func (w *writer) write(b store.Batch) (durable bool) {
	w.flush()
	if !w.spool.pending() && len(w.held) == 0 && w.connect() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := w.store.Write(ctx, b)
		cancel()
		if err == nil {
			w.resumed("store")
			w.recovered()
			w.retainDue = true // after the commit: store1
			return true
		}
		w.fail(err)
	}
	if len(w.held) == 0 {
		err := w.spool.add(b)
		if err == nil {
			w.resumed("spool")
			w.spooling()
			return true
		}
		w.spoolErr = err
	}
	if w.cfg.Tracer.PinPath != "" {
		return w.keepInKernel()
	}
	return w.hold(b)
}

// keepInKernel leaves an interval neither the store nor the spool took
// in a pinned kernel side: not committed, it is collected again (the
// same batch) at the next drain while the kernel adds what it counts
// meanwhile to the next interval; nothing is dropped, and a crash loses
// nothing either (but for what was salvaged from a replaced kernel side,
// its pending interval and the counts added to this side's first one,
// which only this process holds: docs/design.md). Memory is then not
// needed.
func (w *writer) keepInKernel() bool {
	if !w.holding {
		w.holding = true
		w.log.Error("store and spool cannot be written: the pinned kernel side keeps the interval and counts on; retrying every drain",
			"store", w.cfg.Store, "store_err", errString(w.storeErr), "spool", w.spool.path, "spool_err", errString(w.spoolErr), "pin_path", w.cfg.Tracer.PinPath)
	}
	w.heldRetries++
	return false
}

// resumed logs, once, that a write went through after the kernel kept
// the interval (keepInKernel), or, unpinned, after memory kept no batch
// (--buffer-max 0, or each batch larger than it): those were dropped.
// Batches held in memory are logged by flush.
func (w *writer) resumed(into string) {
	if !w.holding || len(w.held) > 0 {
		return
	}
	if w.cfg.Tracer.PinPath != "" {
		w.log.Info("writing recovered: the interval the kernel kept is written", "into", into, "drains_retried", w.heldRetries, "batches_dropped", 0)
	} else {
		w.log.Warn("writing recovered: no batch could be kept in memory meanwhile, so they were dropped", "into", into, "batches_dropped", w.heldDropped, "buffer_max_bytes", w.cfg.BufferMax)
	}
	w.holding, w.heldRetries, w.heldDropped, w.heldWritten = false, 0, 0, 0
}

// logCompaction logs a new error of the store's background compaction,
// once, and its recovery: meanwhile long-range queries read rows (slower,
// still exact).
func (w *writer) logCompaction() {
	_, err := w.store.LastCompaction()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg == w.compactErr {
		return
	}
	if err != nil {
		w.log.Warn("store compaction failed; long-range queries read rows until it works (slower, still exact)", "err", err)
	} else {
		w.log.Info("store compaction works again")
	}
	w.compactErr = msg
}

// hold keeps b in memory, behind the batches already there, dropping
// the oldest past cfg.BufferMax; false when b itself is dropped.
func (w *writer) hold(b store.Batch) bool {
	if !w.holding {
		w.holding = true
		w.log.Error("store and spool cannot be written: keeping the newest batches in memory until they can",
			"store", w.cfg.Store, "store_err", errString(w.storeErr), "spool", w.spool.path, "spool_err", errString(w.spoolErr), "buffer_max_bytes", w.cfg.BufferMax)
	}
	n := batchBytes(b)
	// A batch larger than the whole buffer is dropped alone: it must not
	// push out the batches already kept first.
	if n > w.cfg.BufferMax {
		w.heldDropped++
		w.dropped++
		return false
	}
	for len(w.held) > 0 && w.heldBytes+n > w.cfg.BufferMax {
		w.heldBytes -= w.held[0].bytes
		w.held[0] = heldBatch{} // the array behind the slice must not keep it
		w.held = w.held[1:]
		w.heldDropped++
		w.dropped++
	}
	w.held = append(w.held, heldBatch{b, n})
	w.heldBytes += n
	return true
}

// heldBatch is a batch kept in memory and its estimated size.
type heldBatch struct {
	batch store.Batch
	bytes int64
}

// batchBytes estimates what b takes in memory: its structs and strings.
func batchBytes(b store.Batch) int64 {
	n := int64(unsafe.Sizeof(b)) + int64(len(b.ID))
	for _, h := range b.Hosts {
		n += int64(unsafe.Sizeof(h)) + int64(len(h.ID)+len(h.Name))
		for _, a := range h.Addrs {
			n += int64(unsafe.Sizeof(a)) + int64(len(a))
		}
	}
	for _, sv := range b.Services {
		n += int64(unsafe.Sizeof(sv)) + int64(len(sv.HostID)+len(sv.Proto)+len(sv.Comm))
	}
	for _, o := range b.Observations {
		n += int64(unsafe.Sizeof(o)) + int64(len(o.HostID)+len(o.Direction)+len(o.Proto)+len(o.LocalAddr)+len(o.RemoteAddr)+len(o.Comm)+len(o.PeerComm)+len(o.RemoteName)) + identityBytes(o.Identity)
	}
	for _, l := range b.Listeners {
		n += int64(unsafe.Sizeof(l)) + int64(len(l.HostID)+len(l.Proto)+len(l.LocalAddr)+len(l.Comm))
	}
	for _, d := range b.DNS {
		n += int64(unsafe.Sizeof(d)) + int64(len(d.HostID)+len(d.Comm)+len(d.Proto)+len(d.Resolver)) + identityBytes(d.Identity)
	}
	return n
}

// identityBytes is what an identity's strings take beyond its struct (a
// pod's names and a 64-digit container id are most of a flow's bytes).
func identityBytes(id tracer.Identity) int64 {
	return int64(len(id.Unit) + len(id.ContainerID) + len(id.ContainerName) + len(id.ContainerImage) + len(id.ContainerRuntime) +
		len(id.PodNamespace) + len(id.PodName) + len(id.PodUID) + len(id.K8sContainer) + len(id.Workload))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// flush writes what waits, oldest first: the spool into the store, then
// the batches held in memory into the store or, while it fails, the
// spool. Once memory is empty again it logs one line with what was
// written and dropped meanwhile.
func (w *writer) flush() {
	w.drainSpool()
	if len(w.held) == 0 {
		return
	}
	storeOK := !w.spool.pending() && w.connect()
	for len(w.held) > 0 {
		b := w.held[0]
		written := false
		if storeOK {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := w.store.Write(ctx, b.batch)
			cancel()
			if err == nil {
				written = true
			} else {
				w.fail(err)
				storeOK = false
			}
		}
		if !written {
			if err := w.spool.add(b.batch); err != nil {
				w.spoolErr = err
				return
			}
		}
		w.held[0] = heldBatch{}
		w.held = w.held[1:]
		w.heldBytes -= b.bytes
		w.heldWritten++
	}
	w.log.Info("writing recovered: the batches kept in memory are written",
		"batches_written", w.heldWritten, "batches_dropped", w.heldDropped, "into", map[bool]string{true: "store", false: "spool"}[storeOK])
	w.holding, w.heldWritten, w.heldDropped = false, 0, 0
	w.held = nil
	if storeOK {
		w.recovered()
		w.retainDue = true // runs after the next commit (store1)
	} else {
		w.spooling()
	}
}

func (w *writer) drainSpool() {
	if !w.spool.pending() || !w.connect() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, err := w.spool.replay(func(b store.Batch) error { return w.store.Write(ctx, b) })
	if err != nil {
		w.fail(err)
		return
	}
	if n > 0 {
		w.log.Info("spooled batches written", "batches", n)
	}
	w.recovered()
}

// fail counts a failed store write; what is logged depends on where the
// batch goes (spooling, or hold).
func (w *writer) fail(err error) {
	w.metrics.StoreWriteError()
	w.failing = true
	w.storeErr = err
}

// spooling logs, once, that the store fails and batches are spooled.
func (w *writer) spooling() {
	if w.failing && !w.failLogged && !w.holding {
		w.log.Warn("store write failed; spooling and retrying every 5s", "store", w.cfg.Store, "spool", w.spool.path, "err", w.storeErr)
		w.failLogged = true
	}
}

func (w *writer) recovered() {
	if w.failLogged {
		w.log.Info("store writes recovered")
	}
	w.failing, w.failLogged = false, false
}

// retain applies retention and the size ceiling, at most once a minute.
func (w *writer) retain() {
	r := w.cfg.Retention
	if (r == store.Retention{} && w.cfg.StoreMaxSize <= 0) || w.now().Sub(w.lastRetain) < time.Minute {
		return
	}
	w.lastRetain = w.now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if r != (store.Retention{}) {
		n, err := w.store.RetainLevels(ctx, r, w.now())
		if err != nil {
			w.log.Warn("retention failed", "err", err)
		} else if n > 0 {
			w.log.Debug("retention", "deleted_minute_rows", n)
		}
	}
	if w.cfg.StoreMaxSize <= 0 {
		return
	}
	c, err := w.store.EnforceMaxSize(ctx, w.cfg.StoreMaxSize, w.now())
	if c.Acted {
		w.metrics.CeilingActed()
		w.log.Warn("store over --store-max-size: deleted the oldest buckets", "size_bytes", c.Size, "max_bytes", w.cfg.StoreMaxSize,
			"size_after_bytes", c.After, "history_from", c.From.Format(time.RFC3339), "deleted_minute_rows", c.MinuteRows)
	}
	if err != nil {
		w.log.Warn("applying the store's size ceiling failed", "err", err)
		return
	}
	w.ceilingBlocked(c)
	w.metrics.SetStoreSize(c.After, w.cfg.StoreMaxSize)
}

func (w *writer) now() time.Time {
	if w.clock != nil {
		return w.clock()
	}
	return time.Now()
}

// ceilingBlockedEvery is how often the agent says again that the store
// is over its ceiling with nothing the ceiling may delete.
const ceilingBlockedEvery = time.Hour

// ceilingBlocked reports a store over --store-max-size that the ceiling
// could not bring down because nothing it may delete is left (the
// current hour is never deleted): the gauge, and a warning when that
// starts and at most once an hour while it lasts (it ends, as a rule,
// with the hour). Nothing was deleted: no deletion is counted.
func (w *writer) ceilingBlocked(c store.Ceiling) {
	w.metrics.SetCeilingBlocked(c.Blocked)
	if !c.Blocked {
		w.blockedLogged = time.Time{}
		return
	}
	now := w.now()
	// Once an hour while it lasts; and beside each deletion, whose line
	// would otherwise read as if the store were back under the ceiling.
	if !c.Acted && !w.blockedLogged.IsZero() && now.Sub(w.blockedLogged) < ceilingBlockedEvery {
		return
	}
	w.blockedLogged = now
	size := c.Size
	what := "store over --store-max-size, but nothing deleted: "
	if c.Acted {
		size, what = c.After, "store still over --store-max-size after deleting the oldest buckets: "
	}
	attrs := []any{"size_bytes", size, "max_bytes", w.cfg.StoreMaxSize, "current_hour_rows", c.KeptRows, "batch_ids", c.BatchIDs}
	if c.KeptRows > 0 {
		w.log.Warn(what+"all its buckets left are of the current hour, which the ceiling never deletes",
			append(attrs, "deletable_from", c.DeletableFrom.Format(time.RFC3339),
				"hint", "raise --store-max-size, or wait for the hour to end: the ceiling then deletes it")...)
		return
	}
	w.log.Warn(what+"it holds no buckets, only what the ceiling never deletes (batch ids, kept "+keptFor(store.BatchMemory)+", and the flow keys and names of the current day)",
		append(attrs, "hint", "raise --store-max-size")...)
}

var errSpoolFull = errors.New("spool full")

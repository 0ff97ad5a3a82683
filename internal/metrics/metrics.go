// Package metrics exposes what the agent sees as Prometheus metrics:
// dependency counters with bounded labels, listener health, and the
// agent's own health (losses, drains, store writes, spool).
//
// Flows arrive as per-interval deltas (tracer.Flow); the dependency
// collector adds them into cumulative counters, one series per bounded
// label set, and drops a series once it has been idle for longer than the
// TTL so that departed peers do not accumulate. Labels never hold
// ephemeral ports or pids; the client address of inbound flows is a label
// only when Options.ClientAddr asks for it.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/deptrace/deptrace/tracer"
)

// Defaults of Options.
const (
	DefaultListen    = "127.0.0.1:9477"
	DefaultTTL       = 10 * time.Minute
	DefaultMaxSeries = 20000
	// DefaultMaxIdentityValues bounds the distinct (workload,
	// container) label pairs with Options.Identity.
	DefaultMaxIdentityValues = 1000
	// DefaultMaxRemoteNames bounds the distinct remote_name values with
	// Options.RemoteNames.
	DefaultMaxRemoteNames = 1000
	// DefaultMaxDNSClients and DefaultMaxDNSResolvers bound the DNS
	// series' client (host, process, workload) and resolver labels.
	DefaultMaxDNSClients   = 1000
	DefaultMaxDNSResolvers = 100
	MinTTL                 = time.Second
)

// Options configure Metrics. The zero value is usable: defaults apply.
type Options struct {
	// TTL drops a series idle for longer than this (default 10 min).
	TTL time.Duration
	// ClientAddr adds a client label (the client's IP address) to inbound
	// series. Off by default: client addresses are unbounded.
	ClientAddr bool
	// MaxSeries bounds the dependency and listener series held; past it
	// new series are dropped and counted (default 20000: a scrape costs about 7 KiB a series, docs/performance.md).
	MaxSeries int
	// Identity adds workload and container labels to the dependency
	// series (the local end's workload, and its container's name: never
	// an id). Off by default: it changes every series' labels, and
	// one-off containers' names churn; MaxIdentityValues bounds the
	// distinct pairs held (default 1000), past which new ones read
	// OtherIdentity.
	Identity          bool
	MaxIdentityValues int
	// RemoteNames adds a remote_name label (the server's DNS name, ""
	// when none) to outbound series. Off by default: names are many and
	// an address's name changes, which changes the series;
	// MaxRemoteNames bounds the distinct names held (default 1000), past
	// which new ones read OtherIdentity.
	RemoteNames    bool
	MaxRemoteNames int
	// MaxDNSClients bounds the distinct (host, process, workload) labels
	// of the DNS series (default 1000) and MaxDNSResolvers their
	// resolvers (default 100); past either, new ones read OtherIdentity.
	MaxDNSClients, MaxDNSResolvers int
	// FlowMapSize is the kernel flow map's capacity, exported so that
	// flows per drain can be read as a fill ratio.
	FlowMapSize uint32
	// Now is the clock (tests inject one); default time.Now.
	Now func() time.Time
}

// Metrics holds every metric the agent exports. A nil *Metrics is valid
// and records nothing, so callers need not check whether metrics are on.
type Metrics struct {
	reg        *prometheus.Registry
	deps       *depCollector
	dns        *dnsCollector
	lost       *prometheus.CounterVec
	drain      prometheus.Histogram
	perDrain   prometheus.Histogram
	lastDrain  prometheus.Gauge
	flows      prometheus.Counter
	storeErrs  prometheus.Counter
	spoolBytes atomic.Int64
	spoolDrops atomic.Uint64
	// The memory buffer (batches neither the store nor the spool could
	// take) and the store's size ceiling.
	bufBatches   atomic.Int64
	bufBytes     atomic.Int64
	bufDrops     atomic.Uint64
	storeSize    atomic.Int64
	storeMaxSize atomic.Int64
	ceilingActs  prometheus.Counter
	ceilingBlock atomic.Bool
}

// lossFields are tracer.Losses' counters, named after their json tags
// and found by reflection, so that a new loss cause appears as a reason
// without a change here.
var lossFields = func() (out []lossField) {
	t := reflect.TypeFor[tracer.Losses]()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() != reflect.Uint64 {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			name = f.Name
		}
		out = append(out, lossField{index: i, reason: name})
	}
	return out
}()

type lossField struct {
	index  int
	reason string
}

// New builds the metrics and their registry (with the Go runtime and
// process collectors).
func New(o Options) *Metrics {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.MaxSeries <= 0 {
		o.MaxSeries = DefaultMaxSeries
	}
	if o.MaxIdentityValues <= 0 {
		o.MaxIdentityValues = DefaultMaxIdentityValues
	}
	if o.MaxRemoteNames <= 0 {
		o.MaxRemoteNames = DefaultMaxRemoteNames
	}
	if o.MaxDNSClients <= 0 {
		o.MaxDNSClients = DefaultMaxDNSClients
	}
	if o.MaxDNSResolvers <= 0 {
		o.MaxDNSResolvers = DefaultMaxDNSResolvers
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	m := &Metrics{
		reg:  prometheus.NewRegistry(),
		deps: newDepCollector(o),
		dns:  newDNSCollector(o),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deptrace_events_lost_total",
			Help: "Kernel events deptrace could not record, by reason.",
		}, []string{"reason"}),
		drain: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "deptrace_drain_duration_seconds",
			Help:    "Time one drain of the kernel flow map took.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms .. 4 s
		}),
		perDrain: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "deptrace_flows_per_drain",
			Help:    "Bundled flows read by one drain from the kernel map (before --max-edges-per-node folds them).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10), // 1 .. 262144
		}),
		lastDrain: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "deptrace_last_drain_flows",
			Help: "Bundled flows read by the last drain (before --max-edges-per-node folds them); divided by deptrace_flow_map_capacity it is the map's fill.",
		}),
		flows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "deptrace_flows_total",
			Help: "Bundled flows read from the kernel map (before --max-edges-per-node folds them).",
		}),
		storeErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "deptrace_store_write_errors_total",
			Help: "Failed writes to the store (the batch is spooled and retried).",
		}),
	}
	m.ceilingActs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "deptrace_store_ceiling_deletions_total",
		Help: "Times the store was over --store-max-size and its oldest buckets were deleted.",
	})
	for _, f := range lossFields {
		m.lost.WithLabelValues(f.reason) // every reason exists from the start, at 0
	}
	capacity := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "deptrace_flow_map_capacity",
		Help: "Most distinct bundled flows the kernel map holds per interval (--flow-map-size).",
	})
	capacity.Set(float64(o.FlowMapSize))
	m.reg.MustRegister(m.deps, m.dns, m.lost, m.drain, m.perDrain, m.lastDrain, m.flows, m.storeErrs, capacity,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "deptrace_spool_bytes",
			Help: "Bytes of batches waiting in the spool for the store.",
		}, func() float64 { return float64(m.spoolBytes.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "deptrace_spool_dropped_batches_total",
			Help: "Batches the spool refused because it was full or unwritable, each once (kept in memory instead, deptrace_buffered_batches, or by a pinned kernel side).",
		}, func() float64 { return float64(m.spoolDrops.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "deptrace_buffered_batches",
			Help: "Batches kept in memory because neither the store nor the spool could be written (a full disk).",
		}, func() float64 { return float64(m.bufBatches.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "deptrace_buffered_bytes",
			Help: "Estimated memory of the batches kept in memory (bounded by --buffer-max).",
		}, func() float64 { return float64(m.bufBytes.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "deptrace_dropped_batches_total",
			Help: "Batches lost: neither the store nor the spool could take them and the memory buffer was full (its oldest go first).",
		}, func() float64 { return float64(m.bufDrops.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "deptrace_store_size_bytes",
			Help: "Bytes the store takes (SQLite: pages in use; PostgreSQL: deptrace's tables and indexes), as of the last check (once a minute).",
		}, func() float64 { return float64(m.storeSize.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "deptrace_store_max_size_bytes",
			Help: "The store's size ceiling (--store-max-size); 0: none.",
		}, func() float64 { return float64(m.storeMaxSize.Load()) }),
		m.ceilingActs,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "deptrace_store_ceiling_blocked",
			Help: "1 when the last check (once a minute) found the store over --store-max-size with nothing the ceiling may delete (only the current hour's buckets, which it never deletes): it deleted nothing; else 0.",
		}, func() float64 {
			if m.ceilingBlock.Load() {
				return 1
			}
			return 0
		}),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Registry is where every metric is registered.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ObserveInterval adds one drain's flows, DNS records and losses. host
// names the host of a network namespace (the agent's host ids); drain is
// how long the drain took. The DNS watcher must have filled iv.DNS and
// the flows' RemoteName before.
func (m *Metrics) ObserveInterval(iv tracer.Interval, host func(netns uint32) string, drain time.Duration) {
	m.ObserveDrained(iv, len(iv.Flows), host, drain)
}

// ObserveDrained is ObserveInterval for an interval whose drain read
// read flows from the kernel map, which the agent then folded into
// fewer (the cap on edges per local end, before the metrics see them):
// the drain's own counts (deptrace_flows_total, deptrace_flows_per_drain,
// deptrace_last_drain_flows, the map's fill) are the flows read, the
// dependency series count iv.Flows.
func (m *Metrics) ObserveDrained(iv tracer.Interval, read int, host func(netns uint32) string, drain time.Duration) {
	if m == nil {
		return
	}
	m.drain.Observe(drain.Seconds())
	m.perDrain.Observe(float64(read))
	m.lastDrain.Set(float64(read))
	m.flows.Add(float64(read))
	v := reflect.ValueOf(iv.Lost)
	for _, f := range lossFields {
		if n := v.Field(f.index).Uint(); n > 0 {
			m.lost.WithLabelValues(f.reason).Add(float64(n))
		}
	}
	m.deps.addFlows(iv.Flows, host)
	m.dns.add(iv.DNS, host)
}

// ObserveListeners adds one interval's listener records (accept-queue
// depth and drops of listening sockets).
func (m *Metrics) ObserveListeners(ls []tracer.Listener, host func(netns uint32) string) {
	if m == nil {
		return
	}
	m.deps.addListeners(ls, host)
}

// StoreWriteError counts one failed store write.
func (m *Metrics) StoreWriteError() {
	if m != nil {
		m.storeErrs.Inc()
	}
}

// SetSpool reports the spool's size and how many batches it has dropped
// so far (cumulative).
func (m *Metrics) SetSpool(bytes int64, droppedBatches uint64) {
	if m != nil {
		m.spoolBytes.Store(bytes)
		m.spoolDrops.Store(droppedBatches)
	}
}

// SetBuffer reports the batches kept in memory, their estimated bytes,
// and how many batches were dropped so far (cumulative).
func (m *Metrics) SetBuffer(batches int, bytes int64, dropped uint64) {
	if m != nil {
		m.bufBatches.Store(int64(batches))
		m.bufBytes.Store(bytes)
		m.bufDrops.Store(dropped)
	}
}

// SetStoreSize reports the store's size and its ceiling (0: none).
func (m *Metrics) SetStoreSize(bytes, maxBytes int64) {
	if m != nil {
		m.storeSize.Store(bytes)
		m.storeMaxSize.Store(maxBytes)
	}
}

// SetCeilingBlocked reports whether the last check found the store over
// its size ceiling with nothing the ceiling may delete.
func (m *Metrics) SetCeilingBlocked(blocked bool) {
	if m != nil {
		m.ceilingBlock.Store(blocked)
	}
}

// CeilingActed counts one deletion of old buckets by the size ceiling.
func (m *Metrics) CeilingActed() {
	if m != nil {
		m.ceilingActs.Inc()
	}
}

// CheckListen validates a --metrics-listen value: host:port with a port
// number from 0 (any free port) to 65535 or a service name, or ""
// (disabled).
func CheckListen(addr string) error {
	if addr == "" {
		return nil
	}
	const allowed = `allowed host:port with a port from 1 to 65535 (0: any free one), e.g. ` + DefaultListen + `, or "" to disable`
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return fmt.Errorf("invalid --metrics-listen %q: %s", addr, allowed)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		if _, err := strconv.Atoi(port); err == nil {
			return fmt.Errorf("invalid --metrics-listen %q: port %s is out of range; %s", addr, port, allowed)
		}
		return fmt.Errorf("invalid --metrics-listen %q: port %q is neither a number nor a known service; %s", addr, port, allowed)
	}
	return nil
}

// Serve listens on addr and serves /metrics until ctx is done. The
// listening socket is opened before Serve returns, so a busy port is an
// error here, not later; the returned address is the one bound (useful
// with port 0).
func (m *Metrics) Serve(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen on %s (--metrics-listen): %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintln(w, "deptrace agent: metrics at /metrics") // the client went away
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr(), nil
}

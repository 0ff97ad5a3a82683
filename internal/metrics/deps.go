package metrics

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deptrace/deptrace/tracer"
)

// depKey is one series' labels. Every field is bounded by the number of
// dependencies: the client's ephemeral port, the pid and (unless asked
// for) the client address are not part of it.
type depKey struct {
	direction string
	host      string
	process   string
	remote    string // outbound: the server's address (unix: socket path)
	client    string // inbound with Options.ClientAddr only
	port      string // "" for unix
	proto     string
	// workload and container: with Options.Identity only (see identityOf).
	workload, container string
	// remoteName: outbound with Options.RemoteNames only (see nameOf).
	remoteName string
}

type depSeries struct {
	c    tracer.Counters
	seen time.Time
	// The RTT's minimum and maximum over the last interval that had
	// samples (c keeps the sums and the maximum since the series began).
	rttMin, rttMax uint64
	rttGen         uint64 // the addFlows call they are from
}

type listenerKey struct{ host, process, port string }

type listenerSeries struct {
	drops           uint64
	queueMax, limit uint32
	seen            time.Time
}

// family is one metric name per direction and the Counters field it reads.
type family struct {
	suffix, help string
	value        func(*tracer.Counters) uint64
	tcpOnly      bool // health that only TCP has
	packetOnly   bool // datagrams: udp and unix
}

var families = []family{
	{"connections_total", "Connections opened (TCP handshakes, unix stream connects).", func(c *tracer.Counters) uint64 { return c.Connections }, false, false},
	{"failed_connections_total", "Connection opens that failed.", func(c *tracer.Counters) uint64 { return c.FailedConnections }, false, false},
	{"sent_bytes_total", "Payload bytes sent by the local end.", func(c *tracer.Counters) uint64 { return c.BytesSent }, false, false},
	{"received_bytes_total", "Payload bytes received by the local end.", func(c *tracer.Counters) uint64 { return c.BytesReceived }, false, false},
	{"sent_datagrams_total", "Datagrams sent by the local end.", func(c *tracer.Counters) uint64 { return c.DatagramsSent }, false, true},
	{"received_datagrams_total", "Datagrams received by the local end.", func(c *tracer.Counters) uint64 { return c.DatagramsReceived }, false, true},
	{"sent_resets_total", "TCP resets sent by the local end.", func(c *tracer.Counters) uint64 { return c.ResetsSent }, true, false},
	{"received_resets_total", "TCP resets received by the local end.", func(c *tracer.Counters) uint64 { return c.ResetsReceived }, true, false},
	{"retransmits_total", "TCP segments retransmitted by the local end.", func(c *tracer.Counters) uint64 { return c.Retransmits }, true, false},
}

// causes split failed TCP connections (a label on a family of its own so
// that failed_connections_total keeps the same labels as the others).
var causes = []struct {
	name  string
	value func(*tracer.Counters) uint64
}{
	{"refused", func(c *tracer.Counters) uint64 { return c.FailedRefused }},
	{"timeout", func(c *tracer.Counters) uint64 { return c.FailedTimeout }},
	{"reset", func(c *tracer.Counters) uint64 { return c.FailedReset }},
	{"unreachable", func(c *tracer.Counters) uint64 { return c.FailedUnreachable }},
}

// depCollector holds the dependency and listener series and hands them to
// Prometheus as constant metrics at each scrape; it is the TTL's owner.
type depCollector struct {
	opt Options

	descs     map[string][]*prometheus.Desc // direction -> one per family
	causeDesc map[string]*prometheus.Desc
	latency   *prometheus.Desc // outbound only: the client measures it
	// RTT per direction: a summary (_sum, _count) and the last
	// interval's minimum and maximum.
	rtt, rttMin, rttMax map[string]*prometheus.Desc
	lDrops              *prometheus.Desc
	lQueue              *prometheus.Desc
	lLimit              *prometheus.Desc
	series              *prometheus.Desc
	dropped             *prometheus.Desc
	expired             *prometheus.Desc

	mu        sync.Mutex
	deps      map[depKey]*depSeries
	listeners map[listenerKey]*listenerSeries
	nDropped  uint64
	nExpired  uint64
	// idValues are the distinct (workload, container) label pairs held,
	// and when each was last used; nCapped counts flows labelled
	// OtherIdentity because MaxIdentityValues was reached.
	idValues map[[2]string]time.Time
	nCapped  uint64
	capped   *prometheus.Desc
	// names are the remote names held as labels (Options.RemoteNames)
	// and when each was last used; nNamesCapped counts flows labelled
	// OtherIdentity because MaxRemoteNames was reached.
	names        map[string]time.Time
	nNamesCapped uint64
	namesCapped  *prometheus.Desc
	// gen counts addFlows calls (intervals).
	gen uint64
}

func newDepCollector(o Options) *depCollector {
	c := &depCollector{
		opt:       o,
		descs:     map[string][]*prometheus.Desc{},
		causeDesc: map[string]*prometheus.Desc{},
		deps:      map[depKey]*depSeries{},
		listeners: map[listenerKey]*listenerSeries{},
		idValues:  map[[2]string]time.Time{},
		names:     map[string]time.Time{},
		rtt:       map[string]*prometheus.Desc{},
		rttMin:    map[string]*prometheus.Desc{},
		rttMax:    map[string]*prometheus.Desc{},
	}
	for _, dir := range []string{string(tracer.Outbound), string(tracer.Inbound)} {
		labels := c.labelNames(dir)
		c.rtt[dir] = prometheus.NewDesc("deptrace_"+dir+"_rtt_seconds",
			"Smoothed RTT of the TCP connections (the socket's srtt, read at close and at each interval's end): _sum and _count over the samples, no quantiles.", labels, nil)
		c.rttMin[dir] = prometheus.NewDesc("deptrace_"+dir+"_rtt_min_seconds", "Smallest smoothed RTT sample of the last interval that had one.", labels, nil)
		c.rttMax[dir] = prometheus.NewDesc("deptrace_"+dir+"_rtt_max_seconds", "Largest smoothed RTT sample of the last interval that had one.", labels, nil)
		for _, f := range families {
			c.descs[dir] = append(c.descs[dir], prometheus.NewDesc("deptrace_"+dir+"_"+f.suffix, f.help, labels, nil))
		}
		c.causeDesc[dir] = prometheus.NewDesc("deptrace_"+dir+"_failed_connections_by_cause_total",
			"Failed TCP connection opens by cause: refused, timeout, reset, unreachable.", append(labels, "cause"), nil)
	}
	c.latency = prometheus.NewDesc("deptrace_outbound_connect_latency_seconds",
		"TCP connect latency (SYN sent to established) seen by the client: _sum and _count, no quantiles.", c.labelNames(string(tracer.Outbound)), nil)
	ll := []string{"host", "process", "port"}
	c.lDrops = prometheus.NewDesc("deptrace_listener_drops_total", "Handshake packets (SYNs and completing ACKs; a client's retry counts again) a listening socket dropped because its queues were full: the socket's sk_drops.", ll, nil)
	c.lQueue = prometheus.NewDesc("deptrace_listener_queue_max", "Deepest accept queue of a listening socket in the last interval it was seen.", ll, nil)
	c.lLimit = prometheus.NewDesc("deptrace_listener_backlog_limit", "listen() backlog of a listening socket.", ll, nil)
	c.series = prometheus.NewDesc("deptrace_metrics_series", "Dependency and listener series held (each is several metrics).", nil, nil)
	c.dropped = prometheus.NewDesc("deptrace_metrics_series_dropped_total", "Flows and listeners whose series was not created because the series limit was reached: a flow's counts went to the _other series of its direction and protocol, a listener is not shown.", nil, nil)
	c.expired = prometheus.NewDesc("deptrace_metrics_series_expired_total", "Series dropped after being idle longer than the TTL (--metrics-ttl).", nil, nil)
	c.capped = prometheus.NewDesc("deptrace_metrics_identity_capped_total", "Flows labelled workload=\""+OtherIdentity+"\" because the cap on distinct workload and container values was reached.", nil, nil)
	c.namesCapped = prometheus.NewDesc("deptrace_metrics_remote_names_capped_total", "Outbound flows labelled remote_name=\""+OtherIdentity+"\" because the cap on distinct remote names (--metrics-remote-names-max) was reached.", nil, nil)
	return c
}

// nameOf gives the remote_name label of an outbound flow (Options.
// RemoteNames): its DNS name, "" when it has none; past MaxRemoteNames
// distinct names, new ones are OtherIdentity. c.mu is held.
func (c *depCollector) nameOf(name string, now time.Time) string {
	if name == "" {
		return ""
	}
	name = utf8(name)
	if _, ok := c.names[name]; !ok && len(c.names) >= c.opt.MaxRemoteNames {
		c.nNamesCapped++
		return OtherIdentity
	}
	c.names[name] = now
	return name
}

// OtherIdentity is the workload and container label of a flow whose
// identity would have exceeded Options.MaxIdentityValues.
const OtherIdentity = "_other"

// identityOf gives the workload and container labels of a flow: the
// workload ("Deployment/checkout", "compose/shop/web") and the
// container's name within its pod (Kubernetes) or its runtime name;
// never an id, a pod name or an image. Past MaxIdentityValues distinct
// pairs, new ones are OtherIdentity. c.mu is held.
func (c *depCollector) identityOf(id tracer.Identity, now time.Time) (workload, container string) {
	if id.Empty() {
		return "", ""
	}
	container = id.K8sContainer
	if id.PodName == "" {
		container = id.ContainerName
	}
	v := [2]string{utf8(id.Workload), utf8(container)}
	if v == ([2]string{}) {
		return "", "" // a systemd unit only: the process names it
	}
	if _, ok := c.idValues[v]; !ok && len(c.idValues) >= c.opt.MaxIdentityValues {
		c.nCapped++
		return OtherIdentity, OtherIdentity
	}
	c.idValues[v] = now
	return v[0], v[1]
}

func (c *depCollector) labelNames(dir string) []string {
	var l []string
	switch {
	case dir == string(tracer.Outbound) && c.opt.RemoteNames:
		l = []string{"host", "process", "remote", "port", "proto", "remote_name"}
	case dir == string(tracer.Outbound):
		l = []string{"host", "process", "remote", "port", "proto"}
	case c.opt.ClientAddr:
		l = []string{"host", "process", "port", "proto", "client"}
	default:
		l = []string{"host", "process", "port", "proto"}
	}
	if c.opt.Identity {
		l = append(l, "workload", "container")
	}
	return l
}

func (c *depCollector) labelValues(k depKey) []string {
	var v []string
	switch {
	case k.direction == string(tracer.Outbound) && c.opt.RemoteNames:
		v = []string{k.host, k.process, k.remote, k.port, k.proto, k.remoteName}
	case k.direction == string(tracer.Outbound):
		v = []string{k.host, k.process, k.remote, k.port, k.proto}
	case c.opt.ClientAddr:
		v = []string{k.host, k.process, k.port, k.proto, k.client}
	default:
		v = []string{k.host, k.process, k.port, k.proto}
	}
	if c.opt.Identity {
		v = append(v, k.workload, k.container)
	}
	return v
}

// keyOf maps a flow to its series.
func (c *depCollector) keyOf(f tracer.Flow, host string) depKey {
	k := depKey{direction: string(f.Direction), host: utf8(host), process: utf8(f.Comm), proto: string(f.Proto)}
	if !f.IsUnix() {
		k.port = strconv.Itoa(int(f.Port))
	}
	switch {
	case f.Direction == tracer.Outbound:
		k.remote = utf8(f.RemoteAddr) // unix: the server's socket path
	case c.opt.ClientAddr && !f.IsUnix():
		k.client = f.RemoteAddr
	}
	return k
}

func (c *depCollector) addFlows(flows []tracer.Flow, host func(uint32) string) {
	now := c.opt.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(now)
	c.gen++
	for _, f := range flows {
		if f.Direction != tracer.Outbound && f.Direction != tracer.Inbound {
			continue
		}
		k := c.keyOf(f, host(f.NetNS))
		if c.opt.Identity {
			k.workload, k.container = c.identityOf(f.Identity, now)
		}
		if c.opt.RemoteNames && f.Direction == tracer.Outbound {
			k.remoteName = c.nameOf(f.RemoteName, now)
		}
		s := c.deps[k]
		if s == nil && c.full() {
			// Past the cap a flow's counts go to its direction and
			// protocol's _other series (at most six), so that sums
			// over series stay the whole traffic.
			c.nDropped++
			k = c.overflowKey(k)
			s = c.deps[k]
		}
		if s == nil {
			s = &depSeries{}
			c.deps[k] = s
		}
		if f.RTTSamples > 0 {
			if s.rttGen == c.gen { // another flow of this interval
				s.rttMin, s.rttMax = min(s.rttMin, f.RTTMinUs), max(s.rttMax, f.RTTMaxUs)
			} else {
				s.rttMin, s.rttMax, s.rttGen = f.RTTMinUs, f.RTTMaxUs, c.gen
			}
		}
		s.c.Add(f.Counters)
		s.seen = now
	}
}

func (c *depCollector) addListeners(ls []tracer.Listener, host func(uint32) string) {
	now := c.opt.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(now)
	for _, l := range ls {
		k := listenerKey{host: utf8(host(l.NetNS)), process: utf8(l.Comm), port: strconv.Itoa(int(l.Port))}
		s := c.listeners[k]
		if s == nil {
			if c.full() {
				c.nDropped++
				continue
			}
			s = &listenerSeries{}
			c.listeners[k] = s
		}
		s.drops += l.Drops
		s.queueMax, s.limit, s.seen = l.QueueMax, l.BacklogLimit, now
	}
}

func (c *depCollector) full() bool { return len(c.deps)+len(c.listeners) >= c.opt.MaxSeries }

// overflowKey is the series a flow's counts go to once the cap is
// reached: every label but direction and protocol is OtherIdentity (the
// port "0", unix sockets none).
func (c *depCollector) overflowKey(k depKey) depKey {
	o := depKey{direction: k.direction, proto: k.proto, host: OtherIdentity, process: OtherIdentity}
	if k.port != "" {
		o.port = "0"
	}
	if k.direction == string(tracer.Outbound) {
		o.remote = OtherIdentity
		if c.opt.RemoteNames {
			o.remoteName = OtherIdentity
		}
	} else if c.opt.ClientAddr && k.client != "" {
		o.client = OtherIdentity
	}
	if c.opt.Identity {
		o.workload, o.container = OtherIdentity, OtherIdentity
	}
	return o
}

// expire drops series idle for longer than the TTL; c.mu is held.
func (c *depCollector) expire(now time.Time) {
	for k, s := range c.deps {
		if now.Sub(s.seen) > c.opt.TTL {
			delete(c.deps, k)
			c.nExpired++
		}
	}
	for k, s := range c.listeners {
		if now.Sub(s.seen) > c.opt.TTL {
			delete(c.listeners, k)
			c.nExpired++
		}
	}
	for v, seen := range c.idValues {
		if now.Sub(seen) > c.opt.TTL {
			delete(c.idValues, v)
		}
	}
	for v, seen := range c.names {
		if now.Sub(seen) > c.opt.TTL {
			delete(c.names, v)
		}
	}
}

// Describe implements prometheus.Collector.
func (c *depCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, ds := range c.descs {
		for _, d := range ds {
			ch <- d
		}
	}
	for _, d := range c.causeDesc {
		ch <- d
	}
	for _, m := range []map[string]*prometheus.Desc{c.rtt, c.rttMin, c.rttMax} {
		for _, d := range m {
			ch <- d
		}
	}
	for _, d := range []*prometheus.Desc{c.latency, c.lDrops, c.lQueue, c.lLimit, c.series, c.dropped, c.expired, c.capped, c.namesCapped} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *depCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(c.opt.Now())
	for k, s := range c.deps {
		lv := c.labelValues(k)
		tcp := k.proto == string(tracer.ProtoTCP)
		for i, f := range families {
			if (f.tcpOnly && !tcp) || (f.packetOnly && tcp) {
				continue
			}
			ch <- prometheus.MustNewConstMetric(c.descs[k.direction][i], prometheus.CounterValue, float64(f.value(&s.c)), lv...)
		}
		if !tcp {
			continue
		}
		// Failures are rare: cause series appear with the first failure
		// rather than four zeros on every dependency (a third of a scrape).
		if s.c.FailedConnections > 0 {
			for _, cause := range causes {
				ch <- prometheus.MustNewConstMetric(c.causeDesc[k.direction], prometheus.CounterValue, float64(cause.value(&s.c)), slices.Concat(lv, []string{cause.name})...)
			}
		}
		if k.direction == string(tracer.Outbound) {
			ch <- prometheus.MustNewConstSummary(c.latency, s.c.ConnectLatencyCount, float64(s.c.ConnectLatencySumUs)/1e6, nil, lv...)
		}
		// RTT series appear with the first sample (a dependency whose
		// kernel side reads no RTT has none).
		if s.c.RTTSamples > 0 {
			ch <- prometheus.MustNewConstSummary(c.rtt[k.direction], s.c.RTTSamples, float64(s.c.RTTSumUs)/1e6, nil, lv...)
			ch <- prometheus.MustNewConstMetric(c.rttMin[k.direction], prometheus.GaugeValue, float64(s.rttMin)/1e6, lv...)
			ch <- prometheus.MustNewConstMetric(c.rttMax[k.direction], prometheus.GaugeValue, float64(s.rttMax)/1e6, lv...)
		}
	}
	for k, s := range c.listeners {
		lv := []string{k.host, k.process, k.port}
		ch <- prometheus.MustNewConstMetric(c.lDrops, prometheus.CounterValue, float64(s.drops), lv...)
		ch <- prometheus.MustNewConstMetric(c.lQueue, prometheus.GaugeValue, float64(s.queueMax), lv...)
		ch <- prometheus.MustNewConstMetric(c.lLimit, prometheus.GaugeValue, float64(s.limit), lv...)
	}
	ch <- prometheus.MustNewConstMetric(c.series, prometheus.GaugeValue, float64(len(c.deps)+len(c.listeners)))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(c.nDropped))
	ch <- prometheus.MustNewConstMetric(c.expired, prometheus.CounterValue, float64(c.nExpired))
	ch <- prometheus.MustNewConstMetric(c.capped, prometheus.CounterValue, float64(c.nCapped))
	ch <- prometheus.MustNewConstMetric(c.namesCapped, prometheus.CounterValue, float64(c.nNamesCapped))
}

// utf8 keeps a label value valid: command names and socket paths are
// bytes, and Prometheus refuses invalid UTF-8.
func utf8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

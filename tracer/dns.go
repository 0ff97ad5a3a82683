package tracer

import "time"

// KindDNS marks a DNS record in jsonl.
const KindDNS = "dns"

// DNS is one client's lookups through one resolver over one interval: how
// many it asked, how they were answered and how long the answers took. The
// client is the local end that sent the queries (its namespace, cgroup and
// identity, and its process where the kernel knew it); the resolver is the
// address the queries went to as the client addressed it (127.0.0.53:53,
// Docker's 127.0.0.11:53, a nameserver from resolv.conf). Filled by
// deptrace's DNS watcher from the DNS packets the client's sockets sent
// and received; the Tracer itself does not produce it.
type DNS struct {
	// Kind is always KindDNS.
	Kind     string    `json:"kind"`
	Time     time.Time `json:"time"`
	NetNS    uint32    `json:"netns"`
	PID      uint32    `json:"pid"`
	Comm     string    `json:"comm"`
	CgroupID uint64    `json:"cgroup_id"`
	Identity
	// Proto is how the queries went: "udp" or "tcp".
	Proto Proto `json:"proto"`
	// Resolver is "addr:port" of the server asked.
	Resolver string `json:"resolver"`
	DNSCounters
}

// DNSCounters are what deptrace counts on one client's lookups. Answers
// split by response code: NoError (with or without addresses), NXDomain,
// ServFail and every other code in OtherErrors. Timeouts are queries that
// got no answer within the watcher's timeout. Latency is query sent to
// answer received, over the answered queries.
type DNSCounters struct {
	Queries      uint64 `json:"queries"`
	Answers      uint64 `json:"answers"`
	NoError      uint64 `json:"noerror"`
	NXDomain     uint64 `json:"nxdomain"`
	ServFail     uint64 `json:"servfail"`
	OtherErrors  uint64 `json:"other_errors"`
	Timeouts     uint64 `json:"timeouts"`
	LatencyCount uint64 `json:"latency_count"`
	LatencySumUs uint64 `json:"latency_sum_us"`
	LatencyMaxUs uint64 `json:"latency_max_us"`
	Unparsed     uint64 `json:"unparsed"`
}

// Add accumulates o into c: sums, except the latency maximum.
func (c *DNSCounters) Add(o DNSCounters) {
	c.Queries += o.Queries
	c.Answers += o.Answers
	c.NoError += o.NoError
	c.NXDomain += o.NXDomain
	c.ServFail += o.ServFail
	c.OtherErrors += o.OtherErrors
	c.Timeouts += o.Timeouts
	c.LatencyCount += o.LatencyCount
	c.LatencySumUs += o.LatencySumUs
	c.LatencyMaxUs = max(c.LatencyMaxUs, o.LatencyMaxUs)
	c.Unparsed += o.Unparsed
}

// Failed counts lookups that did not get an answer with addresses or a
// clean NOERROR: NXDOMAIN, SERVFAIL, other error codes and timeouts.
func (c DNSCounters) Failed() uint64 {
	return c.NXDomain + c.ServFail + c.OtherErrors + c.Timeouts
}

package store

import (
	"cmp"
	"math"
	"strings"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// counterColumns are the columns of tracer.Counters, in the order of
// counterFields.
var counterColumns = []string{
	"connections", "failed_connections", "failed_refused", "failed_timeout", "failed_reset", "failed_unreachable",
	"bytes_sent", "bytes_received", "datagrams_sent", "datagrams_received",
	"connect_latency_count", "connect_latency_sum_us", "connect_latency_max_us",
	"resets_sent", "resets_received", "retransmits",
	"rtt_samples", "rtt_sum_us", "rtt_min_us", "rtt_max_us",
}

// v10CounterColumns are the counter columns of schemas 2 to 10, which
// the migrations of those versions name (migration 11 added the RTT).
var v10CounterColumns = counterColumns[:16]

// maxColumns accumulate by maximum; minColumns by the minimum of their
// non-zero values (0 is "no sample": rtt_min_us of a row without RTT
// samples); every other counter column by sum.
var (
	maxColumns = map[string]bool{"connect_latency_max_us": true, "rtt_max_us": true}
	minColumns = map[string]bool{"rtt_min_us": true}
)

// aggregate is the SQL aggregate of counter column c over rows: MAX for a
// maximum, the minimum of the non-zero values (0 when none) for a
// minimum, sum(c) otherwise (sum names the summing aggregate).
func aggregate(c, sum string) string {
	switch {
	case maxColumns[c]:
		return "MAX(" + c + ")"
	case minColumns[c]:
		return "COALESCE(MIN(NULLIF(" + c + ", 0)), 0)"
	}
	return sum + "(" + c + ")"
}

// minNonzero is the minimum of a and b where 0 means none.
func minNonzero(a, b int64) int64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

func counterFields(c *tracer.Counters) []*uint64 {
	return []*uint64{
		&c.Connections, &c.FailedConnections, &c.FailedRefused, &c.FailedTimeout, &c.FailedReset, &c.FailedUnreachable,
		&c.BytesSent, &c.BytesReceived, &c.DatagramsSent, &c.DatagramsReceived,
		&c.ConnectLatencyCount, &c.ConnectLatencySumUs, &c.ConnectLatencyMaxUs,
		&c.ResetsSent, &c.ResetsReceived, &c.Retransmits,
		&c.RTTSamples, &c.RTTSumUs, &c.RTTMinUs, &c.RTTMaxUs,
	}
}

// flowKey is a flow's identity, stored once in flow_keys.
type flowKey struct {
	host, dir, proto, local, remote string
	port                            uint16
	comm, peerComm                  string
}

func keyOf(o Observation) flowKey {
	return flowKey{o.HostID, o.Direction, o.Proto, o.LocalAddr, o.RemoteAddr, o.Port, o.Comm, o.PeerComm}
}

func (k flowKey) compare(o flowKey) int {
	return cmp.Or(strings.Compare(k.host, o.host), strings.Compare(k.dir, o.dir), strings.Compare(k.proto, o.proto),
		strings.Compare(k.local, o.local), strings.Compare(k.remote, o.remote), strings.Compare(k.comm, o.comm),
		strings.Compare(k.peerComm, o.peerComm), int(k.port)-int(o.port))
}

// flowRow is one row of a bucket table: a flow's counters over one bucket.
type flowRow struct {
	bucket      int64
	key         int64
	pid, peer   uint32
	c           tracer.Counters
	first, last int64
}

func (r *flowRow) add(o flowRow) {
	r.c.Add(o.c)
	r.pid = max(r.pid, o.pid)
	r.peer = max(r.peer, o.peer)
	if o.first != 0 && (r.first == 0 || o.first < r.first) {
		r.first = o.first
	}
	r.last = max(r.last, o.last)
}

// level is one resolution of stored counters: raw minute buckets, and the
// rollups that sum them.
type level struct {
	table string
	width int64 // bucket width in nanoseconds
}

var minuteLevel = level{"flow_minutes", int64(time.Minute)}

// levels, finest first. Every write adds to each of them in the same
// transaction, so a rollup row always equals the sum of its minute rows,
// late writes (a spool replayed after an outage) included.
var levels = []level{minuteLevel, {"flow_hours", int64(time.Hour)}, {"flow_days", int64(24 * time.Hour)}}

// floorTo and ceilTo align ns to multiples of w (UTC-aligned for hours and
// days, since the Unix epoch is at a day boundary).
func floorTo(ns, w int64) int64 {
	if ns == math.MinInt64 || ns == math.MaxInt64 {
		return ns
	}
	r := ns % w
	if r < 0 {
		r += w
	}
	return ns - r
}

func ceilTo(ns, w int64) int64 {
	f := floorTo(ns, w)
	if f == ns {
		return ns
	}
	return f + w
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

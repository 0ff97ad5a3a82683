package store

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// dnsTables parallel levels: the DNS table of each resolution, with the
// same rollups and retention as the flows'.
var dnsTables = []string{"dns_minutes", "dns_hours", "dns_days"}

// dnsCounterColumns are the columns of tracer.DNSCounters, in the order of
// dnsFields; latency_max_us accumulates by maximum, the rest by sum.
var dnsCounterColumns = []string{"queries", "answers", "noerror", "nxdomain", "servfail", "other_errors", "timeouts",
	"latency_count", "latency_sum_us", "latency_max_us", "unparsed"}

func dnsFields(c *tracer.DNSCounters) []*uint64 {
	return []*uint64{&c.Queries, &c.Answers, &c.NoError, &c.NXDomain, &c.ServFail, &c.OtherErrors, &c.Timeouts,
		&c.LatencyCount, &c.LatencySumUs, &c.LatencyMaxUs, &c.Unparsed}
}

// dnsKey is one client's lookups through one resolver in one bucket.
type dnsKey struct {
	bucket               int64
	host, comm           string
	container, unit, pod string
	proto, resolver      string
}

func dnsKeyOf(bucket int64, d *DNSObservation) dnsKey {
	return dnsKey{bucket, d.HostID, d.Comm, d.ContainerID, d.Unit, d.PodUID, d.Proto, d.Resolver}
}

func (k dnsKey) compare(o dnsKey) int {
	return cmp.Or(cmp.Compare(k.bucket, o.bucket), cmp.Compare(k.host, o.host), cmp.Compare(k.comm, o.comm),
		cmp.Compare(k.container, o.container), cmp.Compare(k.unit, o.unit), cmp.Compare(k.pod, o.pod),
		cmp.Compare(k.proto, o.proto), cmp.Compare(k.resolver, o.resolver))
}

// merge adds o (of the same client and resolver) into d: summed
// counters, the latest maximum, the pid of the later record.
func (d *DNSObservation) merge(o DNSObservation) {
	if !o.LastSeen.Before(d.LastSeen) {
		d.PID = o.PID
		if !o.Identity.Empty() {
			d.Identity = o.Identity
		}
	}
	d.DNSCounters.Add(o.DNSCounters)
	if !o.FirstSeen.IsZero() && (d.FirstSeen.IsZero() || o.FirstSeen.Before(d.FirstSeen)) {
		d.FirstSeen = o.FirstSeen
	}
	if o.LastSeen.After(d.LastSeen) {
		d.LastSeen = o.LastSeen
	}
}

// writeDNS adds a batch's DNS counters to every level, in the writer's
// transaction (so a batch's id covers them), and records each client's
// identity with the flows' (end_identities). Records without a host or a
// resolver are left out.
func (s *Store) writeDNS(ctx context.Context, tx *sql.Tx, ds []DNSObservation) error {
	if len(ds) == 0 {
		return nil
	}
	// A record without a host or resolver names no client or no resolver:
	// it is left out rather than failing the batch (which the agent would
	// then spool and retry for ever).
	ends := make([]Observation, 0, len(ds))
	kept := make([]DNSObservation, 0, len(ds))
	for i := range ds {
		d := &ds[i]
		if d.HostID == "" || d.Resolver == "" {
			continue
		}
		kept = append(kept, *d)
		ends = append(ends, Observation{Bucket: d.Bucket, HostID: d.HostID, Comm: d.Comm, Identity: d.Identity, FirstSeen: d.FirstSeen, LastSeen: d.LastSeen})
	}
	ds = kept
	cols := "bucket, host_id, comm, container_id, unit, pod_uid, proto, resolver, pid, " + strings.Join(dnsCounterColumns, ", ") + ", first_seen, last_seen"
	ncol := 11 + len(dnsCounterColumns)
	for i, l := range levels {
		merged := map[dnsKey]*DNSObservation{}
		var keys []dnsKey
		for _, d := range ds {
			k := dnsKeyOf(floorTo(ns(d.Bucket.Truncate(time.Minute)), l.width), &d)
			if m, ok := merged[k]; ok {
				m.merge(d)
				continue
			}
			merged[k] = &d
			keys = append(keys, k)
		}
		slices.SortFunc(keys, dnsKey.compare)
		t := dnsTables[i]
		const chunk = 200
		for start := 0; start < len(keys); start += chunk {
			end := min(start+chunk, len(keys))
			var sb strings.Builder
			sb.WriteString(`INSERT INTO ` + t + ` (` + cols + `) VALUES `)
			args := make([]any, 0, (end-start)*ncol)
			row := "(" + strings.TrimSuffix(strings.Repeat("?, ", ncol), ", ") + ")"
			for j, k := range keys[start:end] {
				if j > 0 {
					sb.WriteString(", ")
				}
				sb.WriteString(row)
				d := merged[k]
				args = append(args, k.bucket, k.host, k.comm, k.container, k.unit, k.pod, k.proto, k.resolver, int64(d.PID))
				for _, v := range dnsFields(&d.DNSCounters) {
					args = append(args, int64(*v))
				}
				args = append(args, ns(d.FirstSeen), ns(d.LastSeen))
			}
			fmt.Fprintf(&sb, ` ON CONFLICT (bucket, host_id, comm, container_id, unit, pod_uid, proto, resolver) DO UPDATE SET
				pid = CASE WHEN excluded.last_seen >= %[1]s.last_seen THEN excluded.pid ELSE %[1]s.pid END,
				latency_max_us = CASE WHEN excluded.latency_max_us > %[1]s.latency_max_us THEN excluded.latency_max_us ELSE %[1]s.latency_max_us END,
				first_seen = CASE WHEN excluded.first_seen < %[1]s.first_seen THEN excluded.first_seen ELSE %[1]s.first_seen END,
				last_seen = CASE WHEN excluded.last_seen > %[1]s.last_seen THEN excluded.last_seen ELSE %[1]s.last_seen END`, t)
			for _, c := range dnsCounterColumns {
				if c != "latency_max_us" {
					fmt.Fprintf(&sb, ",\n\t\t\t\t%[2]s = %[1]s.%[2]s + excluded.%[2]s", t, c)
				}
			}
			if _, err := tx.ExecContext(ctx, s.d.rebind(sb.String()), args...); err != nil {
				return fmt.Errorf("write %d DNS rows to %s: %w", end-start, t, err)
			}
		}
	}
	return s.writeEnds(ctx, tx, ends)
}

// DNS returns every client's lookups per resolver with counters in r,
// summed over the range (Bucket is then zero), sorted by host, process,
// container/unit/pod, proto and resolver, each with the identity
// end_identities names for it (container and pod names, workload).
func (s *Store) DNS(ctx context.Context, r Range) ([]DNSObservation, error) {
	return s.dns(ctx, r, levels)
}

func (s *Store) dns(ctx context.Context, r Range, lvls []level) ([]DNSObservation, error) {
	lo, hi, z, err := s.bounds(ctx, r)
	if err != nil {
		return nil, err
	}
	if lo >= hi {
		return nil, nil
	}
	var args []any
	var parts []string
	cols := "host_id, comm, container_id, unit, pod_uid, proto, resolver, pid, " + strings.Join(dnsCounterColumns, ", ") + ", first_seen, last_seen"
	segs := z.old(lo, hi)
	if mlo := max(lo, z.minutes); mlo < hi {
		segs = append(segs, plan(mlo, hi, lvls)...)
	}
	for _, sg := range segs {
		sg.level.table = dnsTables[slices.Index(levels, sg.level)]
		parts = append(parts, segmentSQL(sg, cols, lo, hi, &args))
	}
	if len(parts) == 0 {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, s.d.rebind(strings.Join(parts, "\n UNION ALL ")), args...)
	if err != nil {
		return nil, fmt.Errorf("query DNS counters: %w", err)
	}
	defer rows.Close()
	merged := map[dnsKey]*DNSObservation{}
	for rows.Next() {
		var d DNSObservation
		var pid, first, last int64
		vals := make([]int64, len(dnsCounterColumns))
		dest := []any{&d.HostID, &d.Comm, &d.ContainerID, &d.Unit, &d.PodUID, &d.Proto, &d.Resolver, &pid}
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		dest = append(dest, &first, &last)
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("read DNS counters: %w", err)
		}
		for i, p := range dnsFields(&d.DNSCounters) {
			*p = uint64(vals[i])
		}
		d.PID, d.FirstSeen, d.LastSeen = uint32(pid), fromNs(first), fromNs(last)
		k := dnsKeyOf(0, &d)
		if m, ok := merged[k]; ok {
			m.merge(d)
		} else {
			merged[k] = &d
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read DNS counters: %w", err)
	}
	rows.Close()
	if len(merged) == 0 {
		return nil, nil
	}
	ids, err := s.Identities(ctx, Range{})
	if err != nil {
		return nil, err
	}
	named := make(map[endKey]tracer.Identity, len(ids))
	for _, e := range ids { // by last seen: the latest names win
		named[endKey{e.HostID, e.Comm, e.ContainerID, e.Unit, e.PodUID}] = e.Identity
	}
	out := make([]DNSObservation, 0, len(merged))
	for k, d := range merged {
		if id, ok := named[endKey{k.host, k.comm, k.container, k.unit, k.pod}]; ok {
			d.Identity = id
		}
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b DNSObservation) int { return dnsKeyOf(0, &a).compare(dnsKeyOf(0, &b)) })
	return out, nil
}

package store

import (
	"context"
	"database/sql"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// EndIdentity is what a local end was (its systemd unit, container,
// Kubernetes pod and workload) for one process on one host, and when it
// was seen so. A process name on a host can have several over time (a
// container replaced by another of the same image and command).
type EndIdentity struct {
	HostID string
	Comm   string
	tracer.Identity
	FirstSeen, LastSeen time.Time
}

type endKey struct{ host, comm, container, unit, pod string }

// writeEnds stores, in the writer's transaction, what the batch says of
// its local ends: the identity of each (host, process), and each host's
// own addresses as its flows show them. A flow's local address belongs,
// at that time, to the namespace that reported it: a namespace that was
// gone before its agent could read its addresses (a container that lived
// for one request) is still known to hold them, so the other end of its
// flows can be joined to it.
func (s *Store) writeEnds(ctx context.Context, tx *sql.Tx, obs []Observation) error {
	type span struct {
		id          tracer.Identity
		first, last int64
	}
	ends := map[endKey]*span{}
	type addrKey struct{ host, addr string }
	addrs := map[addrKey]int64{}
	for i := range obs {
		o := &obs[i]
		first, last := ns(o.FirstSeen), max(ns(o.LastSeen), ns(o.Bucket))
		if o.FirstSeen.IsZero() {
			first = ns(o.Bucket)
		}
		if !o.Identity.Empty() {
			k := endKey{o.HostID, o.Comm, o.ContainerID, o.Unit, o.PodUID}
			if e := ends[k]; e == nil {
				ends[k] = &span{o.Identity, first, last}
			} else {
				e.first, e.last = min(e.first, first), max(e.last, last)
				if last >= e.last {
					e.id = o.Identity
				}
			}
		}
		if a, ok := ownAddr(o); ok {
			k := addrKey{o.HostID, a}
			addrs[k] = max(addrs[k], last)
		}
	}
	keys := make([]endKey, 0, len(ends))
	for k := range ends {
		keys = append(keys, k)
	}
	// A stable order: concurrent writers lock rows in the same order.
	slices.SortFunc(keys, func(a, b endKey) int {
		return strings.Compare(a.host+"\x00"+a.comm+"\x00"+a.container+"\x00"+a.unit+"\x00"+a.pod, b.host+"\x00"+b.comm+"\x00"+b.container+"\x00"+b.unit+"\x00"+b.pod)
	})
	for _, k := range keys {
		e := ends[k]
		id := e.id
		// The names of the latest sighting stay: a batch replayed from the
		// spool is older, and must not put back a name the end had before
		// a rename.
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO end_identities (host_id, comm, container_id, unit, pod_uid,
			container_name, container_image, container_runtime, pod_namespace, pod_name, k8s_container, workload, first_seen, last_seen)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (host_id, comm, container_id, unit, pod_uid) DO UPDATE SET
				container_name = CASE WHEN excluded.last_seen >= end_identities.last_seen THEN excluded.container_name ELSE end_identities.container_name END,
				container_image = CASE WHEN excluded.last_seen >= end_identities.last_seen THEN excluded.container_image ELSE end_identities.container_image END,
				container_runtime = CASE WHEN excluded.last_seen >= end_identities.last_seen THEN excluded.container_runtime ELSE end_identities.container_runtime END,
				pod_namespace = CASE WHEN excluded.last_seen >= end_identities.last_seen THEN excluded.pod_namespace ELSE end_identities.pod_namespace END,
				pod_name = CASE WHEN excluded.last_seen >= end_identities.last_seen THEN excluded.pod_name ELSE end_identities.pod_name END,
				k8s_container = CASE WHEN excluded.last_seen >= end_identities.last_seen THEN excluded.k8s_container ELSE end_identities.k8s_container END,
				workload = CASE WHEN excluded.last_seen >= end_identities.last_seen THEN excluded.workload ELSE end_identities.workload END,
				first_seen = CASE WHEN excluded.first_seen < end_identities.first_seen THEN excluded.first_seen ELSE end_identities.first_seen END,
				last_seen = CASE WHEN excluded.last_seen > end_identities.last_seen THEN excluded.last_seen ELSE end_identities.last_seen END`),
			k.host, k.comm, k.container, k.unit, k.pod, id.ContainerName, id.ContainerImage, id.ContainerRuntime,
			id.PodNamespace, id.PodName, id.K8sContainer, id.Workload, e.first, e.last); err != nil {
			return fmt.Errorf("write identity of %s on %s: %w", k.comm, k.host, err)
		}
	}
	akeys := make([]addrKey, 0, len(addrs))
	for k := range addrs {
		akeys = append(akeys, k)
	}
	slices.SortFunc(akeys, func(a, b addrKey) int { return strings.Compare(a.host+"\x00"+a.addr, b.host+"\x00"+b.addr) })
	for _, k := range akeys {
		// Only for a host the store knows (an agent's batch names the
		// hosts of its flows): an address needs its host.
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO host_addrs (host_id, addr, last_seen)
			SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM hosts WHERE id = ?)
			ON CONFLICT (host_id, addr) DO UPDATE SET
				last_seen = CASE WHEN excluded.last_seen > host_addrs.last_seen THEN excluded.last_seen ELSE host_addrs.last_seen END`),
			k.host, k.addr, addrs[k], k.host); err != nil {
			return fmt.Errorf("write address %s of %s: %w", k.addr, k.host, err)
		}
	}
	return nil
}

// ownAddr is the address of o's local end when it names the host that
// reported it: an IP address other than loopback, unspecified, link-local
// (which repeat on every host) or multicast.
func ownAddr(o *Observation) (string, bool) {
	if o.Proto == string(tracer.ProtoUnix) {
		return "", false
	}
	a, err := netip.ParseAddr(o.LocalAddr)
	if err != nil {
		return "", false
	}
	a = a.Unmap()
	if a.IsLoopback() || a.IsUnspecified() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsLinkLocalMulticast() {
		return "", false
	}
	return a.String(), true
}

// Identities returns what local ends were seen to be in range r: per
// host, process and container (or unit, or pod), the latest names and
// the time they span, ordered by host, process and last seen.
func (s *Store) Identities(ctx context.Context, r Range) ([]EndIdentity, error) {
	var args []any
	q := `SELECT host_id, comm, container_id, unit, pod_uid, container_name, container_image, container_runtime,
		pod_namespace, pod_name, k8s_container, workload, first_seen, last_seen FROM end_identities` + seenWhere(r, &args) +
		` ORDER BY host_id, comm, last_seen, container_id, unit, pod_uid`
	rows, err := s.db.QueryContext(ctx, s.d.rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("query identities: %w", err)
	}
	defer rows.Close()
	var out []EndIdentity
	for rows.Next() {
		var e EndIdentity
		var first, last int64
		id := &e.Identity
		if err := rows.Scan(&e.HostID, &e.Comm, &id.ContainerID, &id.Unit, &id.PodUID, &id.ContainerName, &id.ContainerImage,
			&id.ContainerRuntime, &id.PodNamespace, &id.PodName, &id.K8sContainer, &id.Workload, &first, &last); err != nil {
			return nil, fmt.Errorf("read identity: %w", err)
		}
		e.FirstSeen, e.LastSeen = fromNs(first), fromNs(last)
		out = append(out, e)
	}
	return out, rows.Err()
}

package store

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Listener is the state of one listening TCP socket of one host over one
// bucket: the listen backlog (the latest value), the deepest accept queue
// (maximum) and the handshake packets dropped because it was full (sum).
type Listener struct {
	Bucket       time.Time
	HostID       string
	Proto        string
	LocalAddr    string
	Port         uint16
	PID          uint32
	Comm         string
	BacklogLimit uint32
	QueueMax     uint32
	Drops        uint64
	FirstSeen    time.Time
	LastSeen     time.Time
}

type listenerKey struct {
	bucket            int64
	host, proto, addr string
	port              uint16
	comm              string
}

func (k listenerKey) compare(o listenerKey) int {
	return cmp.Or(cmp.Compare(k.bucket, o.bucket), cmp.Compare(k.host, o.host), cmp.Compare(k.proto, o.proto),
		cmp.Compare(k.addr, o.addr), cmp.Compare(k.port, o.port), cmp.Compare(k.comm, o.comm))
}

// merge adds o (of the same key) into l: backlog of the later record,
// deepest queue, summed drops.
func (l *Listener) merge(o Listener) {
	if !o.LastSeen.Before(l.LastSeen) {
		l.BacklogLimit, l.PID = o.BacklogLimit, o.PID
	}
	l.QueueMax = max(l.QueueMax, o.QueueMax)
	l.Drops += o.Drops
	if !o.FirstSeen.IsZero() && (l.FirstSeen.IsZero() || o.FirstSeen.Before(l.FirstSeen)) {
		l.FirstSeen = o.FirstSeen
	}
	if o.LastSeen.After(l.LastSeen) {
		l.LastSeen = o.LastSeen
	}
}

// listenerTables parallel levels: the listener table of each resolution.
var listenerTables = []string{"listener_minutes", "listener_hours", "listener_days"}

func (s *Store) writeListeners(ctx context.Context, tx *sql.Tx, ls []Listener) error {
	if len(ls) == 0 {
		return nil
	}
	for i, l := range levels {
		merged := map[listenerKey]*Listener{}
		var keys []listenerKey
		for _, x := range ls {
			x.Bucket = fromNs(floorTo(ns(x.Bucket.Truncate(time.Minute)), l.width))
			k := listenerKey{ns(x.Bucket), x.HostID, x.Proto, x.LocalAddr, x.Port, x.Comm}
			if m, ok := merged[k]; ok {
				m.merge(x)
				continue
			}
			merged[k] = &x
			keys = append(keys, k)
		}
		slices.SortFunc(keys, listenerKey.compare)
		t := listenerTables[i]
		const chunk = 500
		for start := 0; start < len(keys); start += chunk {
			end := min(start+chunk, len(keys))
			var sb strings.Builder
			sb.WriteString(`INSERT INTO ` + t + ` (bucket, host_id, proto, local_addr, port, comm, pid, backlog_limit, queue_max, drops, first_seen, last_seen) VALUES `)
			var args []any
			for j, k := range keys[start:end] {
				if j > 0 {
					sb.WriteString(", ")
				}
				sb.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
				x := merged[k]
				args = append(args, k.bucket, x.HostID, x.Proto, x.LocalAddr, int(x.Port), x.Comm, int64(x.PID),
					int64(x.BacklogLimit), int64(x.QueueMax), int64(x.Drops), ns(x.FirstSeen), ns(x.LastSeen))
			}
			// SET expressions see the row before the update: the backlog
			// and pid follow the later of the two records.
			fmt.Fprintf(&sb, ` ON CONFLICT (bucket, host_id, proto, local_addr, port, comm) DO UPDATE SET
				pid = CASE WHEN excluded.last_seen >= %[1]s.last_seen THEN excluded.pid ELSE %[1]s.pid END,
				backlog_limit = CASE WHEN excluded.last_seen >= %[1]s.last_seen THEN excluded.backlog_limit ELSE %[1]s.backlog_limit END,
				queue_max = CASE WHEN excluded.queue_max > %[1]s.queue_max THEN excluded.queue_max ELSE %[1]s.queue_max END,
				drops = %[1]s.drops + excluded.drops,
				first_seen = CASE WHEN excluded.first_seen < %[1]s.first_seen THEN excluded.first_seen ELSE %[1]s.first_seen END,
				last_seen = CASE WHEN excluded.last_seen > %[1]s.last_seen THEN excluded.last_seen ELSE %[1]s.last_seen END`, t)
			if _, err := tx.ExecContext(ctx, s.d.rebind(sb.String()), args...); err != nil {
				return fmt.Errorf("write %d listeners to %s: %w", end-start, t, err)
			}
		}
	}
	return nil
}

// Listeners returns every listening socket with state in r, merged over
// the range (Bucket is then zero): the latest backlog, the deepest queue,
// the sum of drops.
func (s *Store) Listeners(ctx context.Context, r Range) ([]Listener, error) {
	return s.listeners(ctx, r, levels)
}

func (s *Store) listeners(ctx context.Context, r Range, lvls []level) ([]Listener, error) {
	lo, hi, z, err := s.bounds(ctx, r)
	if err != nil {
		return nil, err
	}
	if lo >= hi {
		return nil, nil
	}
	var args []any
	var parts []string
	cols := "host_id, proto, local_addr, port, comm, pid, backlog_limit, queue_max, drops, first_seen, last_seen"
	segs := z.old(lo, hi)
	if mlo := max(lo, z.minutes); mlo < hi {
		segs = append(segs, plan(mlo, hi, lvls)...)
	}
	for _, sg := range segs {
		sg.level.table = listenerTables[slices.Index(levels, sg.level)]
		parts = append(parts, segmentSQL(sg, cols, lo, hi, &args))
	}
	if len(parts) == 0 {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, s.d.rebind(strings.Join(parts, "\n UNION ALL ")), args...)
	if err != nil {
		return nil, fmt.Errorf("query listeners: %w", err)
	}
	defer rows.Close()
	type key struct {
		host, proto, addr string
		port              uint16
		comm              string
	}
	merged := map[key]*Listener{}
	for rows.Next() {
		var l Listener
		var port int
		var pid, backlog, queue, drops, first, last int64
		if err := rows.Scan(&l.HostID, &l.Proto, &l.LocalAddr, &port, &l.Comm, &pid, &backlog, &queue, &drops, &first, &last); err != nil {
			return nil, fmt.Errorf("read listener: %w", err)
		}
		l.Port, l.PID, l.BacklogLimit, l.QueueMax, l.Drops = uint16(port), uint32(pid), uint32(backlog), uint32(queue), uint64(drops)
		l.FirstSeen, l.LastSeen = fromNs(first), fromNs(last)
		k := key{l.HostID, l.Proto, l.LocalAddr, l.Port, l.Comm}
		if m, ok := merged[k]; ok {
			m.merge(l)
		} else {
			merged[k] = &l
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read listeners: %w", err)
	}
	out := make([]Listener, 0, len(merged))
	for _, l := range merged {
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b Listener) int {
		return listenerKey{0, a.HostID, a.Proto, a.LocalAddr, a.Port, a.Comm}.compare(listenerKey{0, b.HostID, b.Proto, b.LocalAddr, b.Port, b.Comm})
	})
	return out, nil
}

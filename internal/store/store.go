// Package store keeps the dependency graph's history in SQLite (embedded
// default) or PostgreSQL (fleet mode). It is the only package that knows
// SQL. Both back ends share one schema and one set of statements; the few
// dialect differences live in dialect.
//
// What is stored are observations: bundled flows as one agent saw them,
// with counters accumulated per time bucket. Counters only ever grow;
// nothing is overwritten. Joining the two ends of a dependency happens at
// query time (internal/graph), so an agent never needs another's data.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite"
)

// DefaultPath is the embedded store agent, look, graph and diff use when
// given no --store.
const DefaultPath = "/var/lib/deptrace/deptrace.db"

// DefaultBucket is the time resolution of stored counters.
const DefaultBucket = time.Minute

// Observation is one bundled flow seen by one host's agent, its counters
// summed over one bucket.
type Observation struct {
	Bucket            time.Time
	HostID            string
	Direction         string // "outbound" or "inbound"
	Proto             string
	LocalAddr         string
	RemoteAddr        string
	Port              uint16
	Comm              string
	PID               uint32
	Connections       uint64
	FailedConnections uint64
	BytesSent         uint64
	BytesReceived     uint64
	FirstSeen         time.Time
	LastSeen          time.Time
}

// Host is one host: a machine's root network namespace, or any other
// network namespace with addresses of its own.
type Host struct {
	ID       string
	Name     string
	NetNS    uint32
	Addrs    []string
	LastSeen time.Time
}

// Service is a listening socket: (host, proto, port) and its process.
type Service struct {
	HostID   string
	Proto    string
	Port     uint16
	Comm     string
	LastSeen time.Time
}

// Batch is what an agent writes after one interval.
type Batch struct {
	Hosts        []Host
	Services     []Service
	Observations []Observation
}

// Store is an open database.
type Store struct {
	db      *sql.DB
	d       dialect
	display string
}

// Open opens (and creates or migrates) the store named by spec: a file
// path or sqlite:// URL for SQLite, a postgres:// or postgresql:// URL for
// PostgreSQL. An empty spec is DefaultPath.
func Open(ctx context.Context, spec string) (*Store, error) {
	if spec == "" {
		spec = DefaultPath
	}
	var s *Store
	switch {
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		db, err := sql.Open("pgx", spec)
		if err != nil {
			return nil, fmt.Errorf("open postgres store: %w", err)
		}
		db.SetMaxOpenConns(4)
		s = &Store{db: db, d: postgres, display: redact(spec)}
	default:
		path := strings.TrimPrefix(spec, "sqlite://")
		if strings.Contains(path, "://") {
			return nil, fmt.Errorf("invalid --store %q: want a file path, sqlite://PATH or postgres://...", spec)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, fmt.Errorf("create store directory: %w", err)
		}
		dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(on)"
		db, err := sql.Open("sqlite", dsn)
		if err != nil {
			return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
		}
		// One writer at a time is SQLite's model; WAL lets readers in.
		db.SetMaxOpenConns(1)
		s = &Store{db: db, d: sqlite, display: path}
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.db.PingContext(pingCtx); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("connect to store %s: %w", s.display, err)
	}
	if err := s.migrate(ctx); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("migrate store %s: %w", s.display, err)
	}
	return s, nil
}

// String names the store without credentials.
func (s *Store) String() string { return s.display }

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "postgres://…"
	}
	if p.User != nil {
		p.User = url.User(p.User.Username())
	}
	return p.String()
}

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNs(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, v).UTC()
}

// Write stores one agent's batch in one transaction: hosts and their
// addresses, services, and observations whose counters are added to what
// the same bucket already holds.
func (s *Store) Write(ctx context.Context, b Batch) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	for _, h := range b.Hosts {
		seen := ns(h.LastSeen)
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO hosts (id, name, netns, first_seen, last_seen) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET name = excluded.name, netns = excluded.netns, last_seen = excluded.last_seen`),
			h.ID, h.Name, int64(h.NetNS), seen, seen); err != nil {
			return fmt.Errorf("write host %s: %w", h.ID, err)
		}
		for _, a := range h.Addrs {
			if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO host_addrs (host_id, addr, last_seen) VALUES (?, ?, ?)
				ON CONFLICT (host_id, addr) DO UPDATE SET last_seen = excluded.last_seen`), h.ID, a, seen); err != nil {
				return fmt.Errorf("write address %s of %s: %w", a, h.ID, err)
			}
		}
	}
	for _, sv := range b.Services {
		seen := ns(sv.LastSeen)
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO services (host_id, proto, port, comm, first_seen, last_seen) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (host_id, proto, port, comm) DO UPDATE SET last_seen = excluded.last_seen`),
			sv.HostID, sv.Proto, int(sv.Port), sv.Comm, seen, seen); err != nil {
			return fmt.Errorf("write service %s %s/%d: %w", sv.HostID, sv.Proto, sv.Port, err)
		}
	}
	if err := s.writeObservations(ctx, tx, b.Observations); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

const obsColumns = "bucket, host_id, direction, proto, local_addr, remote_addr, port, comm, pid, connections, failed_connections, bytes_sent, bytes_received, first_seen, last_seen"

// obsKey is the primary key of observations.
type obsKey struct {
	bucket                                int64
	host, dir, proto, local, remote, comm string
	port                                  uint16
}

func (s *Store) writeObservations(ctx context.Context, tx *sql.Tx, obs []Observation) error {
	// Merge duplicates first: one statement may not update a row twice.
	merged := map[obsKey]*Observation{}
	var keys []obsKey
	for i := range obs {
		o := obs[i]
		k := obsKey{ns(o.Bucket), o.HostID, o.Direction, o.Proto, o.LocalAddr, o.RemoteAddr, o.Comm, o.Port}
		if m, ok := merged[k]; ok {
			addInto(m, o)
			continue
		}
		merged[k] = &o
		keys = append(keys, k)
	}
	// A stable order keeps concurrent writers from deadlocking.
	sort.Slice(keys, func(i, j int) bool { return lessKey(keys[i], keys[j]) })
	const chunk = 400
	for start := 0; start < len(keys); start += chunk {
		end := min(start+chunk, len(keys))
		var sb strings.Builder
		sb.WriteString("INSERT INTO observations (" + obsColumns + ") VALUES ")
		args := make([]any, 0, (end-start)*15)
		for i, k := range keys[start:end] {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
			o := merged[k]
			args = append(args, k.bucket, o.HostID, o.Direction, o.Proto, o.LocalAddr, o.RemoteAddr, int(o.Port), o.Comm,
				int64(o.PID), int64(o.Connections), int64(o.FailedConnections), int64(o.BytesSent), int64(o.BytesReceived),
				ns(o.FirstSeen), ns(o.LastSeen))
		}
		sb.WriteString(` ON CONFLICT (bucket, host_id, direction, proto, local_addr, remote_addr, port, comm) DO UPDATE SET
			pid = excluded.pid,
			connections = observations.connections + excluded.connections,
			failed_connections = observations.failed_connections + excluded.failed_connections,
			bytes_sent = observations.bytes_sent + excluded.bytes_sent,
			bytes_received = observations.bytes_received + excluded.bytes_received,
			first_seen = CASE WHEN excluded.first_seen < observations.first_seen THEN excluded.first_seen ELSE observations.first_seen END,
			last_seen = CASE WHEN excluded.last_seen > observations.last_seen THEN excluded.last_seen ELSE observations.last_seen END`)
		if _, err := tx.ExecContext(ctx, s.d.rebind(sb.String()), args...); err != nil {
			return fmt.Errorf("write %d observations: %w", end-start, err)
		}
	}
	return nil
}

func lessKey(a, b obsKey) bool {
	if a.bucket != b.bucket {
		return a.bucket < b.bucket
	}
	as := []string{a.host, a.dir, a.proto, a.local, a.remote, a.comm}
	bs := []string{b.host, b.dir, b.proto, b.local, b.remote, b.comm}
	for i := range as {
		if as[i] != bs[i] {
			return as[i] < bs[i]
		}
	}
	return a.port < b.port
}

func addInto(m *Observation, o Observation) {
	m.Connections += o.Connections
	m.FailedConnections += o.FailedConnections
	m.BytesSent += o.BytesSent
	m.BytesReceived += o.BytesReceived
	if !o.FirstSeen.IsZero() && (m.FirstSeen.IsZero() || o.FirstSeen.Before(m.FirstSeen)) {
		m.FirstSeen = o.FirstSeen
	}
	if o.LastSeen.After(m.LastSeen) {
		m.LastSeen = o.LastSeen
		if o.PID != 0 {
			m.PID = o.PID
		}
	}
}

// Range selects buckets that overlap [Since, Until); zero means open.
type Range struct {
	Since, Until time.Time
	bucketed     bool
}

func (r Range) where(d dialect, args *[]any) string {
	var conds []string
	if !r.Since.IsZero() {
		conds = append(conds, "last_seen >= ?")
		*args = append(*args, ns(r.Since))
	}
	if !r.Since.IsZero() && r.bucketed {
		// Lets the primary key (bucket first) narrow the scan.
		conds = append(conds, "bucket > ?")
		*args = append(*args, ns(r.Since.Add(-DefaultBucket)))
	}
	if !r.Until.IsZero() {
		conds = append(conds, "first_seen < ?")
		*args = append(*args, ns(r.Until))
	}
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
}

// Observations returns the observations that overlap r, each summed over
// its buckets (Bucket is then zero).
func (s *Store) Observations(ctx context.Context, r Range) ([]Observation, error) {
	var args []any
	r.bucketed = true
	q := `SELECT host_id, direction, proto, local_addr, remote_addr, port, comm, MAX(pid),
		SUM(connections), SUM(failed_connections), SUM(bytes_sent), SUM(bytes_received), MIN(first_seen), MAX(last_seen)
		FROM observations` + r.where(s.d, &args) + `
		GROUP BY host_id, direction, proto, local_addr, remote_addr, port, comm
		ORDER BY host_id, direction, proto, local_addr, remote_addr, port, comm`
	rows, err := s.db.QueryContext(ctx, s.d.rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("query observations: %w", err)
	}
	defer rows.Close()
	var out []Observation
	for rows.Next() {
		var o Observation
		var port int
		var pid, conns, failed, sent, recv, first, last int64
		if err := rows.Scan(&o.HostID, &o.Direction, &o.Proto, &o.LocalAddr, &o.RemoteAddr, &port, &o.Comm, &pid,
			&conns, &failed, &sent, &recv, &first, &last); err != nil {
			return nil, fmt.Errorf("read observation: %w", err)
		}
		o.Port, o.PID = uint16(port), uint32(pid)
		o.Connections, o.FailedConnections, o.BytesSent, o.BytesReceived = uint64(conns), uint64(failed), uint64(sent), uint64(recv)
		o.FirstSeen, o.LastSeen = fromNs(first), fromNs(last)
		out = append(out, o)
	}
	return out, rows.Err()
}

// Hosts returns every known host with its addresses.
func (s *Store) Hosts(ctx context.Context) ([]Host, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT h.id, h.name, h.netns, h.last_seen, COALESCE(a.addr, '')
		FROM hosts h LEFT JOIN host_addrs a ON a.host_id = h.id ORDER BY h.id, a.addr`)
	if err != nil {
		return nil, fmt.Errorf("query hosts: %w", err)
	}
	defer rows.Close()
	var out []Host
	for rows.Next() {
		var h Host
		var netns, last int64
		var addr string
		if err := rows.Scan(&h.ID, &h.Name, &netns, &last, &addr); err != nil {
			return nil, fmt.Errorf("read host: %w", err)
		}
		if n := len(out); n > 0 && out[n-1].ID == h.ID {
			if addr != "" {
				out[n-1].Addrs = append(out[n-1].Addrs, addr)
			}
			continue
		}
		h.NetNS, h.LastSeen = uint32(netns), fromNs(last)
		if addr != "" {
			h.Addrs = []string{addr}
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// Services returns listening services seen since r.Since (all if zero).
func (s *Store) Services(ctx context.Context, r Range) ([]Service, error) {
	var args []any
	q := `SELECT host_id, proto, port, comm, last_seen FROM services` + r.where(s.d, &args) + ` ORDER BY host_id, proto, port, comm`
	rows, err := s.db.QueryContext(ctx, s.d.rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("query services: %w", err)
	}
	defer rows.Close()
	var out []Service
	for rows.Next() {
		var sv Service
		var port int
		var last int64
		if err := rows.Scan(&sv.HostID, &sv.Proto, &port, &sv.Comm, &last); err != nil {
			return nil, fmt.Errorf("read service: %w", err)
		}
		sv.Port, sv.LastSeen = uint16(port), fromNs(last)
		out = append(out, sv)
	}
	return out, rows.Err()
}

// Retain deletes every bucket that ended before cutoff, and returns how
// many observation rows went. A bucket that ends after cutoff is never
// touched, however little of it is recent.
func (s *Store) Retain(ctx context.Context, cutoff time.Time, bucket time.Duration) (int64, error) {
	if bucket <= 0 {
		return 0, errors.New("retain: bucket must be positive")
	}
	// Buckets start at multiples of bucket; one that starts at or before
	// cutoff-bucket has ended by cutoff.
	lastWholeStart := cutoff.Add(-bucket).Truncate(bucket)
	res, err := s.db.ExecContext(ctx, s.d.rebind(`DELETE FROM observations WHERE bucket <= ?`), ns(lastWholeStart))
	if err != nil {
		return 0, fmt.Errorf("delete old buckets: %w", err)
	}
	n, _ := res.RowsAffected()
	if _, err := s.db.ExecContext(ctx, s.d.rebind(`DELETE FROM services WHERE last_seen < ?`), ns(cutoff)); err != nil {
		return n, fmt.Errorf("delete old services: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, s.d.rebind(`DELETE FROM host_addrs WHERE last_seen < ?`), ns(cutoff)); err != nil {
		return n, fmt.Errorf("delete old host addresses: %w", err)
	}
	return n, nil
}

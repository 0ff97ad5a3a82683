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
	"io/fs"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite"

	"github.com/deptrace/deptrace/tracer"
)

// DefaultPath is the embedded store agent, look, graph and diff use when
// given no --store.
const DefaultPath = "/var/lib/deptrace/deptrace.db"

// DefaultBucket is the time resolution of stored counters.
const DefaultBucket = time.Minute

// Observation is one bundled flow seen by one host's agent, its counters
// summed over one bucket. For unix flows (Proto "unix", Port 0) the
// addresses are socket paths and PeerComm names the process at the other
// end; PeerComm is part of the flow's identity (an accepting unix server
// sees each client process as a flow of its own).
type Observation struct {
	Bucket     time.Time
	HostID     string
	Direction  string // "outbound" or "inbound"
	Proto      string
	LocalAddr  string
	RemoteAddr string
	Port       uint16
	Comm       string
	PID        uint32
	PeerPID    uint32
	PeerComm   string
	// RemoteName is the DNS name the client asked for and got RemoteAddr
	// in an answer ("" when none did); outbound tcp and udp only.
	RemoteName string
	// Identity names the local end (unit, container, pod, workload).
	// It is stored per host and process (see Identities), not per flow:
	// Observations read back leave it empty.
	tracer.Identity
	tracer.Counters
	FirstSeen time.Time
	LastSeen  time.Time
}

// Host is one host: a machine's root network namespace, or any other
// network namespace with addresses of its own.
type Host struct {
	ID       string
	Name     string
	NetNS    uint32
	Addrs    []string
	LastSeen time.Time
	// AddrsSeen, read back by Hosts, is when each of Addrs was last
	// seen there (the same order); ignored by Write.
	AddrsSeen []time.Time `json:",omitempty"`
}

// Service is a listening socket: (host, proto, port) and its process.
type Service struct {
	HostID   string
	Proto    string
	Port     uint16
	Comm     string
	LastSeen time.Time
}

// Batch is what an agent writes after one interval. ID, when set, makes
// the write idempotent: a batch whose ID the store has already applied is
// skipped, so replaying a spool that still holds it after a crash counts
// nothing twice. IDs must be unique per batch across every agent (agent
// instance + sequence).
type Batch struct {
	ID           string `json:",omitempty"`
	Hosts        []Host
	Services     []Service
	Observations []Observation
	Listeners    []Listener
	DNS          []DNSObservation
}

// DNSObservation is one client's lookups through one resolver in one
// bucket: the client is a process (with its identity) on a host, the
// resolver "addr:port" as the client addressed it.
type DNSObservation struct {
	Bucket time.Time
	HostID string
	Comm   string
	PID    uint32
	tracer.Identity
	Proto    string // "udp" or "tcp"
	Resolver string
	tracer.DNSCounters
	FirstSeen time.Time
	LastSeen  time.Time
}

// Store is an open database.
type Store struct {
	db         *sql.DB
	d          dialect
	display    string
	lastForget atomic.Int64 // unix ns; see forgetOldBatches
	// lastLogPrune is when this store last pruned the write log (unix ns).
	lastLogPrune atomic.Int64
	// cache, when enabled (EnableCache), keeps sums of past hours and
	// days for Observations.
	cache *cache
	// keyCache keeps the ids of flow keys written lately (keyids.go).
	keyCache keyIDCache
	stmtMu   sync.Mutex
	stmts    map[writeShape]*sql.Stmt // see prepareWrites
	// Row shapes a write used before they were prepared (see
	// preparedRows), the column sets admitted, how often writes wanted
	// the others, and the prepareWrites preparing each (see
	// prepareWrites).
	stmtsWanted   map[writeShape]bool
	columnSets    map[columnSet]bool
	setsWanted    map[columnSet]int
	setsPreparing map[columnSet]int
	closed        bool // under stmtMu: statements prepared after Close are closed
	// The background compaction writes start (see compactSoon).
	lastCompact   atomic.Int64
	noAutoCompact atomic.Bool
	bgMu          sync.Mutex
	bgCtx         context.Context
	bgCancel      context.CancelFunc
	bgRunning     bool
	bg            sync.WaitGroup
	bgStats       CompactStats
	bgErr         error
}

// Open opens (and creates or migrates) the store named by spec: a file
// path or sqlite:// URL for SQLite, a postgres:// or postgresql:// URL for
// PostgreSQL. An empty spec is DefaultPath. A spec CheckSpec refuses is
// refused with its error.
func Open(ctx context.Context, spec string) (*Store, error) {
	if spec == "" {
		spec = DefaultPath
	}
	if err := CheckSpec(spec); err != nil {
		return nil, err
	}
	var s *Store
	switch {
	case isPostgres(spec):
		db, err := sql.Open("pgx", spec)
		if err != nil {
			return nil, fmt.Errorf("open postgres store: %w", err)
		}
		db.SetMaxOpenConns(4)
		s = &Store{db: db, d: postgres, display: redact(spec)}
	default:
		path := strings.TrimPrefix(spec, "sqlite://")
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			return nil, fmt.Errorf("create store directory: %w", err)
		}
		dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(on)"
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
	if err := s.retryBusy(pingCtx, func() error { return s.db.PingContext(pingCtx) }); err != nil {
		_ = s.db.Close() // the open's error is the one to report
		return nil, fmt.Errorf("connect to store %s: %w", s.display, err)
	}
	if err := s.retryBusy(pingCtx, func() error { return s.migrate(ctx) }); err != nil {
		_ = s.db.Close() // the open's error is the one to report
		return nil, fmt.Errorf("migrate store %s: %w", s.display, err)
	}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	return s, nil
}

// retryBusy runs fn again while SQLite answers SQLITE_BUSY, until ctx's
// deadline. Agents opening one store together can get it at once, without
// the busy timeout: while one switches a new file to WAL, or when one's
// migration reads then writes while another writes (SQLite does not wait
// where waiting could deadlock). A retry starts over cleanly: a fresh
// connection runs the pragmas again, a fresh transaction re-reads.
func (s *Store) retryBusy(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if err == nil || s.d != sqlite || !strings.Contains(err.Error(), "SQLITE_BUSY") {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// String names the store without credentials.
func (s *Store) String() string { return s.display }

// Close closes the database.
func (s *Store) Close() error {
	s.bgMu.Lock()
	if s.bgCancel != nil {
		s.bgCancel()
	}
	s.bgMu.Unlock()
	s.bg.Wait()
	s.stmtMu.Lock()
	for _, st := range s.stmts {
		st.Close()
	}
	s.stmts = nil
	s.closed = true
	s.stmtMu.Unlock()
	return s.db.Close()
}

// specKinds is what a store spec may be, as Open takes it.
const specKinds = "want a file path, sqlite://PATH or postgres://URL"

func isPostgres(spec string) bool {
	return strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://")
}

// CheckSpec refuses a store spec that no retry can open: a scheme Open
// does not take (InvalidSpec), or a PostgreSQL URL that does not parse
// (pgx's error, which hides the password). A store that cannot be reached
// now passes (PostgreSQL down, an SQLite file that cannot be opened yet,
// a TLS file the URL names that cannot be read yet): an agent spools
// until it answers, so only what can never work may stop it at start.
func CheckSpec(spec string) error {
	switch {
	case isPostgres(spec):
		_, err := pgx.ParseConfig(spec)
		var file *fs.PathError
		if err != nil && !errors.As(err, &file) {
			return fmt.Errorf("invalid --store: %w; %s", err, specKinds)
		}
	case strings.Contains(strings.TrimPrefix(spec, "sqlite://"), "://"):
		return InvalidSpec(spec)
	}
	return nil
}

// InvalidSpec is the error for a store spec of no kind Open takes (a
// scheme other than sqlite:// and postgres://), its password hidden.
func InvalidSpec(spec string) error {
	return fmt.Errorf("invalid --store %q: %s", redact(spec), specKinds)
}

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
// addresses, services, and observations, listeners and DNS counters whose
// counters are added to what the same bucket already holds.
func (s *Store) Write(ctx context.Context, b Batch) error {
	if len(b.Observations) > 0 {
		if err := s.prepareWrites(ctx); err != nil {
			return err
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if b.ID != "" {
		// First, so that a concurrent writer of the same batch waits on
		// this row and then finds it applied.
		res, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO applied_batches (id, applied_at) VALUES (?, ?) ON CONFLICT (id) DO NOTHING`),
			b.ID, time.Now().UnixNano())
		if err != nil {
			return fmt.Errorf("record batch %s: %w", b.ID, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("record batch %s: %w", b.ID, err)
		} else if n == 0 {
			return nil // applied before: nothing to do
		}
		if err := s.forgetOldBatches(ctx, tx); err != nil {
			return err
		}
	}
	for _, h := range b.Hosts {
		seen := ns(h.LastSeen)
		// A batch replayed from the spool can be older than one already
		// written: it widens first and last seen but does not put back the
		// name or netns the host had then. (SET reads the row as it was.)
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO hosts (id, name, netns, first_seen, last_seen) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET
				name = CASE WHEN excluded.last_seen >= hosts.last_seen THEN excluded.name ELSE hosts.name END,
				netns = CASE WHEN excluded.last_seen >= hosts.last_seen THEN excluded.netns ELSE hosts.netns END,
				first_seen = CASE WHEN excluded.first_seen < hosts.first_seen THEN excluded.first_seen ELSE hosts.first_seen END,
				last_seen = CASE WHEN excluded.last_seen > hosts.last_seen THEN excluded.last_seen ELSE hosts.last_seen END`),
			h.ID, h.Name, int64(h.NetNS), seen, seen); err != nil {
			return fmt.Errorf("write host %s: %w", h.ID, err)
		}
		for _, a := range h.Addrs {
			// The latest sighting stays (a batch replayed from the spool is
			// older): the graph resolves an address some hosts held one
			// after another by when each was last seen with it.
			if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO host_addrs (host_id, addr, last_seen) VALUES (?, ?, ?)
				ON CONFLICT (host_id, addr) DO UPDATE SET
					last_seen = CASE WHEN excluded.last_seen > host_addrs.last_seen THEN excluded.last_seen ELSE host_addrs.last_seen END`), h.ID, a, seen); err != nil {
				return fmt.Errorf("write address %s of %s: %w", a, h.ID, err)
			}
		}
	}
	for _, sv := range b.Services {
		seen := ns(sv.LastSeen)
		// Widened only, as a host's: a range reads a service by both
		// (seenWhere), so a replayed older batch must not narrow them.
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO services (host_id, proto, port, comm, first_seen, last_seen) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (host_id, proto, port, comm) DO UPDATE SET
				first_seen = CASE WHEN excluded.first_seen < services.first_seen THEN excluded.first_seen ELSE services.first_seen END,
				last_seen = CASE WHEN excluded.last_seen > services.last_seen THEN excluded.last_seen ELSE services.last_seen END`),
			sv.HostID, sv.Proto, int(sv.Port), sv.Comm, seen, seen); err != nil {
			return fmt.Errorf("write service %s %s/%d: %w", sv.HostID, sv.Proto, sv.Port, err)
		}
	}
	keyGen := s.keyCache.generation()
	freshKeys, err := s.writeFlows(ctx, tx, b.Observations)
	if err != nil {
		return err
	}
	if err := s.writeEnds(ctx, tx, b.Observations); err != nil {
		return err
	}
	if err := s.writeListeners(ctx, tx, b.Listeners); err != nil {
		return err
	}
	if err := s.writeDNS(ctx, tx, b.DNS); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	s.keyCache.add(freshKeys, keyGen, time.Now().UnixNano())
	if len(b.Observations) > 0 {
		s.compactSoon()
	}
	return nil
}

// Hosts returns every known host with its addresses.
func (s *Store) Hosts(ctx context.Context) ([]Host, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT h.id, h.name, h.netns, h.last_seen, COALESCE(a.addr, ''), COALESCE(a.last_seen, 0)
		FROM hosts h LEFT JOIN host_addrs a ON a.host_id = h.id ORDER BY h.id, a.addr`)
	if err != nil {
		return nil, fmt.Errorf("query hosts: %w", err)
	}
	defer rows.Close()
	var out []Host
	for rows.Next() {
		var h Host
		var netns, last, addrSeen int64
		var addr string
		if err := rows.Scan(&h.ID, &h.Name, &netns, &last, &addr, &addrSeen); err != nil {
			return nil, fmt.Errorf("read host: %w", err)
		}
		if n := len(out); n > 0 && out[n-1].ID == h.ID {
			if addr != "" {
				out[n-1].Addrs = append(out[n-1].Addrs, addr)
				out[n-1].AddrsSeen = append(out[n-1].AddrsSeen, fromNs(addrSeen))
			}
			continue
		}
		h.NetNS, h.LastSeen = uint32(netns), fromNs(last)
		if addr != "" {
			h.Addrs = []string{addr}
			h.AddrsSeen = []time.Time{fromNs(addrSeen)}
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// Services returns listening services seen since r.Since (all if zero).
func (s *Store) Services(ctx context.Context, r Range) ([]Service, error) {
	var args []any
	q := `SELECT host_id, proto, port, comm, last_seen FROM services` + seenWhere(r, &args) + ` ORDER BY host_id, proto, port, comm`
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

// BatchMemory is how long the ids of applied batches are kept: a batch
// replayed later than this after it was applied would count twice. The
// spool is replayed as soon as the store answers, so this only matters
// for an agent that crashed in the middle of a write and stayed down for
// a month.
const BatchMemory = 30 * 24 * time.Hour

// forgetOldBatches deletes batch ids older than BatchMemory, at most once
// an hour per open store.
func (s *Store) forgetOldBatches(ctx context.Context, tx *sql.Tx) error {
	now := time.Now()
	last := s.lastForget.Load()
	if now.UnixNano()-last < int64(time.Hour) || !s.lastForget.CompareAndSwap(last, now.UnixNano()) {
		return nil
	}
	if _, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM applied_batches WHERE applied_at < ?`), now.Add(-BatchMemory).UnixNano()); err != nil {
		return fmt.Errorf("forget old batch ids: %w", err)
	}
	return nil
}

// seenWhere selects rows whose first/last seen overlap r.
func seenWhere(r Range, args *[]any) string {
	var conds []string
	lo, hi := r.bounds()
	if lo != math.MinInt64 {
		conds = append(conds, "last_seen >= ?")
		*args = append(*args, lo)
	}
	if hi != math.MaxInt64 {
		conds = append(conds, "first_seen < ?")
		*args = append(*args, hi)
	}
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
}

// Retain deletes every bucket that ended before cutoff, at every level
// (one window for every level: see RetainLevels for one per level)
// (minute rows and rollups), and returns how many minute rows went. A
// bucket that ends after cutoff is never touched, however little of it is
// recent. bucket is the width of the finest level (DefaultBucket).
func (s *Store) Retain(ctx context.Context, cutoff time.Time, bucket time.Duration) (int64, error) {
	if bucket != time.Duration(minuteLevel.width) {
		return 0, fmt.Errorf("retain: bucket %s: this store keeps %s buckets", bucket, time.Duration(minuteLevel.width))
	}
	// Queries start no earlier than the oldest minute kept (see
	// retainedFrom), so a rollup bucket that straddles the cutoff is
	// answered from its remaining minutes and hours, never from its sum.
	from := floorTo(ns(cutoff), minuteLevel.width)
	if err := s.recordCutoff(ctx, retained{from, from, from}); err != nil {
		return 0, err
	}
	// Open minutes before the cutoff into their hours and days first,
	// after it is recorded (see advanceRetention).
	if err := s.rollUpOpen(ctx, from); err != nil {
		return 0, err
	}
	var n int64
	coarsest := minuteLevel.width
	for i, tables := range retainedTables() {
		l := tables.level
		coarsest = max(coarsest, l.width)
		// Buckets start at multiples of the width; one that starts at or
		// before cutoff-width has ended by cutoff.
		lastWholeStart := floorTo(ns(cutoff)-l.width, l.width)
		for _, t := range []string{"flow_pieces", "piece_todo"} {
			if _, err := s.db.ExecContext(ctx, s.d.rebind(`DELETE FROM `+t+` WHERE level = ? AND bucket <= ?`), i, lastWholeStart); err != nil {
				return n, fmt.Errorf("delete old buckets of %s: %w", t, err)
			}
		}
		for _, t := range tables.names {
			res, err := s.db.ExecContext(ctx, s.d.rebind(`DELETE FROM `+t+` WHERE bucket <= ?`), lastWholeStart)
			if err != nil {
				return n, fmt.Errorf("delete old buckets of %s: %w", t, err)
			}
			if t == minuteLevel.table {
				n, _ = res.RowsAffected()
			}
		}
	}
	// A key last seen before every level's retention has no rows left.
	// In the same transaction, retention tells caches (cache.go) to
	// start over: SQLite may hand a deleted key's id to a new key.
	if err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM flow_keys WHERE last_seen < ?`), ns(cutoff)-coarsest)
		if err != nil {
			return fmt.Errorf("delete old flow keys: %w", err)
		}
		if n, _ := res.RowsAffected(); n > 0 {
			s.keyCache.clear()
			if _, err := tx.ExecContext(ctx, `DELETE FROM key_pack`); err != nil {
				return fmt.Errorf("delete the key pack: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO write_log (at, bucket) VALUES (?, ?)`), time.Now().UnixNano(), logEverything); err != nil {
			return fmt.Errorf("append to the write log: %w", err)
		}
		return nil
	}); err != nil {
		return n, err
	}
	// The names of the ends of the day row the cutoff falls in stay with
	// it, as advanceRetention keeps them: a later read of that row names
	// them.
	return n, s.forgetNames(ctx, floorTo(from, coarsest))
}

// inTx runs fn in a transaction and commits it.
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// retainedTables lists, per level, the bucket tables retention prunes.
func retainedTables() []struct {
	level level
	names []string
} {
	var out []struct {
		level level
		names []string
	}
	for i, l := range levels {
		out = append(out, struct {
			level level
			names []string
		}{l, []string{l.table, listenerTables[i], dnsTables[i]}})
	}
	return out
}

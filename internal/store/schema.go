package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// dialect holds what differs between SQLite and PostgreSQL.
type dialect struct {
	name string
	// placeholders: SQLite takes ?, PostgreSQL $1, $2, ...
	numbered bool
	// lock serialises migrations across concurrent agents.
	lock string
}

var (
	sqlite   = dialect{name: "sqlite"}
	postgres = dialect{name: "postgres", numbered: true, lock: "SELECT pg_advisory_xact_lock(7346271)"}
)

// rebind turns ? placeholders into the dialect's.
func (d dialect) rebind(q string) string {
	if !d.numbered {
		return q
	}
	var sb strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			sb.WriteByte('$')
			sb.WriteString(strconv.Itoa(n))
			continue
		}
		sb.WriteRune(r)
	}
	return sb.String()
}

// migrations[i] brings the schema from version i to i+1. Append only;
// never edit a released one.
var migrations = []string{
	// 1: hosts, their addresses, services and bucketed observations.
	`CREATE TABLE hosts (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL,
		netns BIGINT NOT NULL,
		first_seen BIGINT NOT NULL,
		last_seen BIGINT NOT NULL
	);
	CREATE TABLE host_addrs (
		host_id TEXT NOT NULL REFERENCES hosts(id) ON DELETE CASCADE,
		addr TEXT NOT NULL,
		last_seen BIGINT NOT NULL,
		PRIMARY KEY (host_id, addr)
	);
	CREATE INDEX host_addrs_addr ON host_addrs (addr);
	CREATE TABLE services (
		host_id TEXT NOT NULL,
		proto TEXT NOT NULL,
		port INTEGER NOT NULL,
		comm TEXT NOT NULL,
		first_seen BIGINT NOT NULL,
		last_seen BIGINT NOT NULL,
		PRIMARY KEY (host_id, proto, port, comm)
	);
	CREATE TABLE observations (
		bucket BIGINT NOT NULL,
		host_id TEXT NOT NULL,
		direction TEXT NOT NULL,
		proto TEXT NOT NULL,
		local_addr TEXT NOT NULL,
		remote_addr TEXT NOT NULL,
		port INTEGER NOT NULL,
		comm TEXT NOT NULL,
		pid BIGINT NOT NULL,
		connections BIGINT NOT NULL,
		failed_connections BIGINT NOT NULL,
		bytes_sent BIGINT NOT NULL,
		bytes_received BIGINT NOT NULL,
		first_seen BIGINT NOT NULL,
		last_seen BIGINT NOT NULL,
		PRIMARY KEY (bucket, host_id, direction, proto, local_addr, remote_addr, port, comm)
	)`,
}

// SchemaVersion is the version this build writes.
var SchemaVersion = len(migrations)

func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if s.d.lock != "" {
		if _, err := tx.ExecContext(ctx, s.d.lock); err != nil {
			return fmt.Errorf("lock schema: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	var version int
	err = tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&version)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if version > len(migrations) {
		return fmt.Errorf("store has schema version %d, this deptrace knows up to %d: upgrade deptrace", version, len(migrations))
	}
	for v := version; v < len(migrations); v++ {
		for _, stmt := range strings.Split(migrations[v], ";") {
			if strings.TrimSpace(stmt) == "" {
				continue
			}
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("migration %d: %w", v+1, err)
			}
		}
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO schema_version (version) VALUES (?)`), v+1); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Version reads the schema version of the open store.
func (s *Store) Version(ctx context.Context) (int, error) {
	var v int
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_version`).Scan(&v)
	return v, err
}

package store

import (
	"context"
	"database/sql"
)

// MigrationV1 is the first released schema, to test upgrades from it.
var MigrationV1 = migrations[0]

// DB exposes the database to tests that prepare an old schema or check
// tables directly.
func (s *Store) DB() *sql.DB { return s.db }

// ObservationsFromMinutes answers a range from minute buckets only,
// ignoring rollups: the reference the rollups must equal.
func (s *Store) ObservationsFromMinutes(ctx context.Context, r Range) ([]Observation, error) {
	return s.observations(ctx, r, levels[:1])
}

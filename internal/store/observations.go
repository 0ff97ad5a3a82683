package store

import (
	"context"
	"fmt"
	"math"
)

// Observations returns, for every flow with counters in r, its counters
// summed over the range (Bucket is then zero), sorted by flow key. The
// whole past days, hours and minutes of the range are read from their
// pieces where compaction built them (see pieces.go), the rest from
// rollups where the range allows (see Range), and the flows named from
// the key pack (keypack.go); SQLite's rows are summed here rather than
// in SQL: a GROUP BY over a million rows costs SQLite a sort.
func (s *Store) Observations(ctx context.Context, r Range) ([]Observation, error) {
	return s.observations(ctx, r, levels, true)
}

// nameObservations fills the RemoteName of each of out whose flow key has
// one (flow_names: the latest non-empty name written for it).
func (s *Store) nameObservations(ctx context.Context, lo int64, out []Observation) error {
	if len(out) == 0 {
		return nil
	}
	var args []any
	q := `SELECT k.host_id, k.direction, k.proto, k.local_addr, k.remote_addr, k.port, k.comm, k.peer_comm, n.name
		FROM flow_names n JOIN flow_keys k ON k.id = n.key_id`
	if lo != math.MinInt64 {
		q += ` WHERE k.last_seen >= ?`
		args = append(args, lo)
	}
	rows, err := s.db.QueryContext(ctx, s.d.rebind(q), args...)
	if err != nil {
		return fmt.Errorf("query remote names: %w", err)
	}
	defer rows.Close()
	names := map[flowKey]string{}
	for rows.Next() {
		var k flowKey
		var port int
		var name string
		if err := rows.Scan(&k.host, &k.dir, &k.proto, &k.local, &k.remote, &port, &k.comm, &k.peerComm, &name); err != nil {
			return fmt.Errorf("read remote name: %w", err)
		}
		k.port = uint16(port)
		names[k] = name
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read remote names: %w", err)
	}
	if len(names) == 0 {
		return nil
	}
	for i := range out {
		if n, ok := names[keyOf(out[i])]; ok {
			out[i].RemoteName = n
		}
	}
	return nil
}

// observations answers r from the levels lvls, and from pieces if
// usePieces (and lvls are all the levels).
func (s *Store) observations(ctx context.Context, r Range, lvls []level, usePieces bool) ([]Observation, error) {
	out, err := s.observationsUnnamed(ctx, r, lvls, usePieces)
	if err != nil {
		return nil, err
	}
	lo, _ := r.bounds()
	return out, s.nameObservations(ctx, lo, out)
}

func (s *Store) observationsUnnamed(ctx context.Context, r Range, lvls []level, usePieces bool) ([]Observation, error) {
	lo, hi, z, err := s.bounds(ctx, r)
	if err != nil {
		return nil, err
	}
	if lo >= hi {
		return nil, nil
	}
	// The part older than the minutes kept comes from coarser rows; the
	// rest (from mlo) is planned as if nothing were older.
	old := z.old(lo, hi)
	mlo := max(lo, z.minutes)
	if c := s.cache; c != nil && len(lvls) == len(levels) && usePieces {
		// One query at a time fills and reads the cache: see cache.sync.
		c.mu.Lock()
		defer c.mu.Unlock()
		var out []Observation
		err := s.read(ctx, func(rd reader) error {
			var err error
			out, err = c.observations(rd, lo, mlo, hi, old)
			return err
		})
		return out, err
	}
	var out []Observation
	err = s.read(ctx, func(rd reader) error {
		var segs []segment
		var pieces []pieceID
		if mlo < hi {
			w, err := rd.openFrom()
			if err != nil {
				return err
			}
			segs = planOpen(mlo, hi, w, lvls)
			if len(lvls) == len(levels) && usePieces {
				if segs, pieces, err = coldPlanOpen(rd, mlo, hi, w); err != nil {
					return err
				}
			}
		}
		sm := newSums()
		if usePieces {
			if err := sumOld(rd, old, lo, hi, sm); err != nil {
				return err
			}
		} else if err := rd.sums(old, lo, hi, sm); err != nil {
			return err
		}
		if err := rd.sums(segs, mlo, hi, sm); err != nil {
			return err
		}
		if err := addPieces(rd, pieces, sm); err != nil {
			return err
		}
		if len(sm.flows) == 0 {
			return nil
		}
		var err error
		if usePieces {
			out, err = sm.namedObservations(rd, lo)
			return err
		}
		keys := make(map[int64]flowKey, len(sm.flows))
		if err := rd.keys(lo, sm.has, func(id int64, k flowKey) { keys[id] = k }); err != nil {
			return err
		}
		out, err = sm.observations(keys)
		return err
	})
	return out, err
}

// keysSQL reads the keys of every flow seen since lo: a flow with a row in
// a range starting at lo was last seen at lo or later.
func keysSQL(lo int64, args *[]any) string {
	q := `SELECT id, host_id, direction, proto, local_addr, remote_addr, port, comm, peer_comm FROM flow_keys`
	if lo != math.MinInt64 {
		q += ` WHERE last_seen >= ?`
		*args = append(*args, lo)
	}
	return q
}

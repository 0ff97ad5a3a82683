package store

import (
	"context"
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

// observations answers r from the levels lvls, and from pieces if
// usePieces (and lvls are all the levels).
func (s *Store) observations(ctx context.Context, r Range, lvls []level, usePieces bool) ([]Observation, error) {
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
			segs = plan(mlo, hi, lvls)
			if len(lvls) == len(levels) && usePieces {
				var err error
				if segs, pieces, err = coldPlan(rd, mlo, hi); err != nil {
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

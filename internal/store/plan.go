package store

import (
	"context"
	"math"
	"strings"
	"time"
)

// Range selects a time range [Since, Until); a zero end is open.
//
// Counters are kept per bucket, so a range is answered at bucket
// resolution: a minute bucket wholly inside the range counts wholly; a
// minute bucket the range cuts (at most one at each end) counts if its
// events (first to last seen) overlap the range; other buckets do not
// count. Hourly and daily rollups answer for the hours and days wholly
// inside the range, which gives the same sums as the minute buckets.
type Range struct {
	Since, Until time.Time
}

func (r Range) bounds() (lo, hi int64) {
	lo, hi = math.MinInt64, math.MaxInt64
	if !r.Since.IsZero() {
		lo = rangeEnd(r.Since)
	}
	if !r.Until.IsZero() {
		hi = rangeEnd(r.Until)
	}
	return lo, hi
}

// The times a range end keeps as nanoseconds: two days inside int64's
// (years 1678 to 2262), so that rounding to a bucket of any level never
// overflows. A time outside them is the open end on its side (the
// store's sentinels, math.MinInt64 and math.MaxInt64), not UnixNano's
// undefined value.
var (
	earliestEnd = time.Unix(0, math.MinInt64+2*levels[len(levels)-1].width)
	latestEnd   = time.Unix(0, math.MaxInt64-2*levels[len(levels)-1].width)
)

func rangeEnd(t time.Time) int64 {
	switch {
	case !t.After(earliestEnd):
		return math.MinInt64
	case !t.Before(latestEnd):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// segment is one part of a range answered by one table: buckets in
// [lo, hi), and with events set, only rows whose events overlap the range.
type segment struct {
	level  level
	lo, hi int64
	events bool
}

// plan splits a range into segments, answering each part from the
// coarsest level whose whole buckets fit in it. With rollups false, every
// segment reads minute buckets (used to check the rollups).
func plan(lo, hi int64, lvls []level) []segment {
	minute := lvls[0].width
	var head, tail []segment
	a, b := lo, hi
	if f := floorTo(lo, minute); f != lo {
		head = []segment{{lvls[0], f, f + minute, true}}
		a = f + minute
	}
	if f := floorTo(hi, minute); f != hi {
		if len(head) > 0 && head[0].lo == f { // both ends in one minute
			return head
		}
		tail = []segment{{lvls[0], f, f + minute, true}}
		b = f
	}
	var mid []segment
	var fill func(a, b int64, i int)
	fill = func(a, b int64, i int) {
		if a >= b {
			return
		}
		if i == 0 {
			mid = append(mid, segment{lvls[0], a, b, false})
			return
		}
		w := lvls[i].width
		c0, c1 := ceilTo(a, w), floorTo(b, w)
		if c0 >= c1 {
			fill(a, b, i-1)
			return
		}
		fill(a, c0, i-1)
		mid = append(mid, segment{lvls[i], c0, c1, false})
		fill(c1, b, i-1)
	}
	fill(a, b, len(lvls)-1)
	return joinSegments(head, mid, tail)
}

// segmentSQL selects the rows of one segment.
func segmentSQL(sg segment, cols string, lo, hi int64, args *[]any) string {
	var conds []string
	if sg.lo != math.MinInt64 {
		conds = append(conds, "bucket >= ?")
		*args = append(*args, sg.lo)
	}
	if sg.hi != math.MaxInt64 {
		conds = append(conds, "bucket < ?")
		*args = append(*args, sg.hi)
	}
	if sg.events {
		if lo != math.MinInt64 {
			conds = append(conds, "last_seen >= ?")
			*args = append(*args, lo)
		}
		if hi != math.MaxInt64 {
			conds = append(conds, "first_seen < ?")
			*args = append(*args, hi)
		}
	}
	q := "SELECT " + cols + " FROM " + sg.level.table
	if len(conds) > 0 {
		q += " WHERE " + strings.Join(conds, " AND ")
	}
	return q
}

// bounds are r's ends in nanoseconds, the start no earlier than what
// retention kept at any level, and where each level's kept history
// starts.
func (s *Store) bounds(ctx context.Context, r Range) (lo, hi int64, z retained, err error) {
	lo, hi = r.bounds()
	z, err = s.retained(ctx)
	return max(lo, z.days), hi, z, err
}

// joinSegments concatenates segment lists in order; adjacent segments of
// one level without an event filter become one scan.
func joinSegments(lists ...[]segment) []segment {
	var merged []segment
	for _, l := range lists {
		for _, sg := range l {
			if n := len(merged); n > 0 && !sg.events && !merged[n-1].events && merged[n-1].level == sg.level && merged[n-1].hi == sg.lo {
				merged[n-1].hi = sg.hi
				continue
			}
			merged = append(merged, sg)
		}
	}
	return merged
}

package store

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"math"
	"strings"
)

// reader reads flow counters within one read transaction (one snapshot),
// through the database driver itself rather than database/sql: a row's 21
// integers are taken from the driver's values (SQLite) or decoded in place
// from binary (PostgreSQL), nothing converted into a destination.
type reader interface {
	// sums adds the rows of the segments of [lo, hi) to sm, per flow.
	sums(segs []segment, lo, hi int64, sm *sums) error
	// buckets calls fn with every row of level l in buckets [from, to).
	buckets(l level, from, to int64, fn func(bucket, key int64, row *flowSum)) error
	// keys calls fn with the key of every flow seen since lo that want
	// accepts.
	keys(lo int64, want func(int64) bool, fn func(int64, flowKey)) error
	// keysByID calls fn with the key of each of ids that exists.
	keysByID(ids []int64, fn func(int64, flowKey)) error
	// pieceDir calls fn with every piece of level l with a bucket in
	// [from, to), ascending.
	pieceDir(l int, from, to int64, fn func(pieceID)) error
	// pieces calls fn with the data of each of ids that exists (valid
	// until fn returns).
	pieces(ids []pieceID, fn func(pieceID, []byte) error) error
	// keyPack reads the key pack (nil: none; see keypack.go).
	keyPack() (*keyPack, error)
	// oldest is the oldest minute bucket stored (math.MaxInt64: none).
	oldest() (int64, error)
	// openFrom is the oldest minute a host holds open (math.MaxInt64:
	// none): hours and days from its hour on are read from minutes (see
	// openminute.go).
	openFrom() (int64, error)
	// logSince reads the write log after pos (see cache.sync): the hour
	// buckets written since (logEverything: all), whether entries pos had
	// not seen were pruned, and the position now.
	logSince(pos logPos) (hours []int64, lost bool, next logPos, err error)
}

// logPos is how far a cache has read the write log: the last id (SQLite)
// or the snapshot it last read in (PostgreSQL).
type logPos struct {
	id   int64
	snap string
}

// logEverything is the bucket of a write log entry that changes every
// bucket (retention).
const logEverything = -1

// read runs fn with a reader in a read-only transaction.
func (s *Store) read(ctx context.Context, fn func(reader) error) error {
	if s.d.name == postgres.name {
		return s.pgRead(ctx, fn)
	}
	c, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("begin query: %w", err)
	}
	defer func() { _ = c.Close() }() // returns a read connection to the pool
	return c.Raw(func(dc any) error {
		bt, ok1 := dc.(driver.ConnBeginTx)
		qc, ok2 := dc.(driver.QueryerContext)
		if !ok1 || !ok2 {
			return fmt.Errorf("begin query: the driver's connection (%T) cannot query", dc)
		}
		tx, err := bt.BeginTx(ctx, driver.TxOptions{ReadOnly: true})
		if err != nil {
			return fmt.Errorf("begin query: %w", err)
		}
		defer func() { _ = tx.Rollback() }() // a read-only snapshot: nothing to commit
		return fn(&sqliteReader{ctx: ctx, qc: qc})
	})
}

type sqliteReader struct {
	ctx context.Context
	qc  driver.QueryerContext
}

// query runs q and calls row with each row's values (valid until it
// returns).
func (r *sqliteReader) query(q string, args []any, ncol int, row func([]driver.Value) error) error {
	named := make([]driver.NamedValue, len(args))
	for i, a := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	rows, err := r.qc.QueryContext(r.ctx, q, named)
	if err != nil {
		return err
	}
	defer func() { _ = rows.Close() }() // errors surface in rows.Err
	if n := len(rows.Columns()); n != ncol {
		return fmt.Errorf("%d columns, want %d", n, ncol)
	}
	dest := make([]driver.Value, ncol)
	for {
		if err := rows.Next(dest); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := row(dest); err != nil {
			return err
		}
	}
}

// flowRows reads q's rows of bucketColumns, after extra leading integer
// columns, into row.
func (r *sqliteReader) flowRows(q string, args []any, extra int, fn func(lead []int64, key int64, row *flowSum)) error {
	var row flowSum
	lead := make([]int64, extra)
	vals := make([]*int64, 0, extra+21)
	for i := range lead {
		vals = append(vals, &lead[i])
	}
	var key int64
	vals = append(vals, &key, &row.pid, &row.peer)
	for i := range row.c {
		vals = append(vals, &row.c[i])
	}
	vals = append(vals, &row.first, &row.last)
	return r.query(q, args, len(vals), func(dest []driver.Value) error {
		ok := true
		for i := 0; i < len(dest) && ok; i++ {
			*vals[i], ok = dest[i].(int64)
		}
		if !ok {
			return fmt.Errorf("a column is not an integer")
		}
		fn(lead, key, &row)
		return nil
	})
}

// sums streams the rows and sums them here: no GROUP BY (SQLite sorted
// every row for it).
func (r *sqliteReader) sums(segs []segment, lo, hi int64, sm *sums) error {
	for _, sg := range segs {
		var args []any
		q := segmentSQL(sg, bucketColumns, lo, hi, &args)
		if err := r.flowRows(q, args, 0, func(_ []int64, key int64, row *flowSum) { sm.add(key, row) }); err != nil {
			return fmt.Errorf("read %s: %w", sg.level.table, err)
		}
	}
	return nil
}

func (r *sqliteReader) buckets(l level, from, to int64, fn func(bucket, key int64, row *flowSum)) error {
	q := "SELECT bucket, " + bucketColumns + " FROM " + l.table + " WHERE bucket >= ? AND bucket < ?"
	if err := r.flowRows(q, []any{from, to}, 1, func(lead []int64, key int64, row *flowSum) { fn(lead[0], key, row) }); err != nil {
		return fmt.Errorf("read %s: %w", l.table, err)
	}
	return nil
}

func (r *sqliteReader) keyRows(q string, args []any, want func(int64) bool, fn func(int64, flowKey)) error {
	err := r.query(q, args, 9, func(dest []driver.Value) error {
		id, ok := dest[0].(int64)
		port, ok2 := dest[6].(int64)
		if !ok || !ok2 {
			return fmt.Errorf("id or port is not an integer")
		}
		if want != nil && !want(id) {
			return nil
		}
		var k flowKey
		for i, p := range []*string{&k.host, &k.dir, &k.proto, &k.local, &k.remote, nil, &k.comm, &k.peerComm} {
			if p == nil {
				continue
			}
			switch v := dest[1+i].(type) {
			case string:
				*p = v
			case []byte:
				*p = string(v)
			default:
				return fmt.Errorf("column %d is a %T, not text", 1+i, v)
			}
		}
		k.port = uint16(port)
		fn(id, k)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read flow keys: %w", err)
	}
	return nil
}

func (r *sqliteReader) keys(lo int64, want func(int64) bool, fn func(int64, flowKey)) error {
	var args []any
	q := keysSQL(lo, &args)
	return r.keyRows(q, args, want, fn)
}

func (r *sqliteReader) keysByID(ids []int64, fn func(int64, flowKey)) error {
	for start := 0; start < len(ids); start += 500 {
		part := ids[start:min(start+500, len(ids))]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		var none []any
		q := keysSQL(math.MinInt64, &none) + " WHERE id IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(part)), ", ") + ")"
		if err := r.keyRows(q, args, nil, fn); err != nil {
			return err
		}
	}
	return nil
}

// logSince: ids are handed out in commit order (one writer at a time),
// so what the cache has not seen is what comes after the last id it read.
func (r *sqliteReader) logSince(pos logPos) ([]int64, bool, logPos, error) {
	var pruned int64
	err := r.query(`SELECT pruned_through FROM write_log_state WHERE id = 1`, nil, 1, func(dest []driver.Value) error {
		var ok bool
		pruned, ok = dest[0].(int64)
		if !ok {
			return fmt.Errorf("pruned_through is not an integer")
		}
		return nil
	})
	if err != nil {
		return nil, false, pos, fmt.Errorf("read the write log: %w", err)
	}
	var hours []int64
	next := pos
	err = r.query(`SELECT bucket, MAX(id) FROM write_log WHERE id > ? GROUP BY bucket`, []any{pos.id}, 2, func(dest []driver.Value) error {
		b, ok := dest[0].(int64)
		id, ok2 := dest[1].(int64)
		if !ok || !ok2 {
			return fmt.Errorf("bucket or id is not an integer")
		}
		hours = append(hours, b)
		next.id = max(next.id, id)
		return nil
	})
	if err != nil {
		return nil, false, pos, fmt.Errorf("read the write log: %w", err)
	}
	next.id = max(next.id, pruned)
	return hours, pruned > pos.id, next, nil
}

func (r *sqliteReader) oldest() (int64, error) {
	from := int64(math.MaxInt64)
	err := r.query(`SELECT MIN(bucket) FROM flow_minutes`, nil, 1, func(dest []driver.Value) error {
		if v, ok := dest[0].(int64); ok {
			from = v
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("read the oldest bucket: %w", err)
	}
	return from, nil
}

func (r *sqliteReader) openFrom() (int64, error) {
	from := int64(math.MaxInt64)
	err := r.query(openFromSQL, nil, 1, func(dest []driver.Value) error {
		if v, ok := dest[0].(int64); ok {
			from = v
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("read the open minutes: %w", err)
	}
	return from, nil
}

// pieceDirSQL selects the buckets of a level's pieces in [from, to).
func pieceDirSQL(l int, from, to int64, args *[]any) string {
	q := `SELECT bucket FROM flow_pieces WHERE level = ?`
	*args = append(*args, int64(l))
	if from != math.MinInt64 {
		q += ` AND bucket >= ?`
		*args = append(*args, from)
	}
	if to != math.MaxInt64 {
		q += ` AND bucket < ?`
		*args = append(*args, to)
	}
	return q + ` ORDER BY bucket`
}

func (r *sqliteReader) pieceDir(l int, from, to int64, fn func(pieceID)) error {
	var args []any
	q := pieceDirSQL(l, from, to, &args)
	err := r.query(q, args, 1, func(dest []driver.Value) error {
		b, ok := dest[0].(int64)
		if !ok {
			return fmt.Errorf("bucket is not an integer")
		}
		fn(pieceID{l, b})
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the pieces stored: %w", err)
	}
	return nil
}

func (r *sqliteReader) pieces(ids []pieceID, fn func(pieceID, []byte) error) error {
	for _, id := range ids {
		err := r.query(`SELECT data FROM flow_pieces WHERE level = ? AND bucket = ?`, []any{int64(id.level), id.bucket}, 1, func(dest []driver.Value) error {
			b, ok := dest[0].([]byte)
			if !ok {
				return fmt.Errorf("data is a %T, not bytes", dest[0])
			}
			return fn(id, b)
		})
		if err != nil {
			return fmt.Errorf("read a piece: %w", err)
		}
	}
	return nil
}

func (r *sqliteReader) keyPack() (*keyPack, error) {
	var p *keyPack
	err := r.query(`SELECT data FROM key_pack WHERE id = 1`, nil, 1, func(dest []driver.Value) error {
		b, ok := dest[0].([]byte)
		if !ok {
			return fmt.Errorf("data is a %T, not bytes", dest[0])
		}
		var err error
		p, err = decodeKeyPack(b)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the key pack: %w", err)
	}
	return p, nil
}

package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// writeFlows writes obs's rows in tx and returns the flow-key ids it
// wrote, for the key cache once tx commits.
func (s *Store) writeFlows(ctx context.Context, tx *sql.Tx, obs []Observation) (map[flowKey]cachedKeyID, error) {
	if len(obs) == 0 {
		return nil, nil
	}
	// The distinct keys, each hashed once: obs[i]'s is keys[keyAt[i]].
	at := make(map[flowKey]int, len(obs))
	keys := make([]usedKey, 0, len(obs))
	keyAt := make([]int, len(obs))
	for i := range obs {
		o := &obs[i]
		k := keyOf(*o)
		j, ok := at[k]
		if !ok {
			j = len(keys)
			at[k] = j
			keys = append(keys, usedKey{key: k})
		}
		keys[j].lastSeen = max(keys[j].lastSeen, ns(o.LastSeen), ns(o.Bucket))
		keyAt[i] = j
	}
	fresh, err := s.keyIDs(ctx, tx, keys, at)
	if err != nil {
		return nil, err
	}
	rows := make([]flowRow, 0, len(obs))
	hosts := make([]string, 0, len(obs))
	for i := range obs {
		o := &obs[i]
		rows = append(rows, flowRow{bucket: ns(o.Bucket.Truncate(time.Minute)), key: keys[keyAt[i]].id, pid: o.PID, peer: o.PeerPID,
			c: o.Counters, first: ns(o.FirstSeen), last: ns(o.LastSeen)})
		hosts = append(hosts, o.HostID)
	}
	// The rows of a host's open minute go to the minute table only (see
	// openminute.go); the roll-ups run before the minute rows change.
	minuteOnly, rolled, err := s.deferRollups(ctx, tx, hosts, rows)
	if err != nil {
		return nil, err
	}
	if err := s.upsertRows(ctx, tx, levels[0], rows); err != nil {
		return nil, err
	}
	everyLevel := rows
	if slices.Contains(minuteOnly, true) {
		everyLevel = make([]flowRow, 0, len(rows))
		for i, r := range rows {
			if !minuteOnly[i] {
				everyLevel = append(everyLevel, r)
			}
		}
	}
	for _, l := range levels[1:] {
		if err := s.upsertRows(ctx, tx, l, everyLevel); err != nil {
			return nil, err
		}
	}
	if err := s.writeNames(ctx, tx, obs, rows); err != nil {
		return nil, err
	}
	if err := s.invalidatePieces(ctx, tx, rows, rolled); err != nil {
		return nil, err
	}
	return fresh, s.logWrite(ctx, tx, rows, rolled)
}

// usedKey is a flow key a write uses: its latest event (unix ns) and,
// once resolved, its id.
type usedKey struct {
	key      flowKey
	lastSeen int64
	id       int64
}

// keyIDs sets the id of each of keys (at: the index of each key in
// keys): from the key cache where the key's row needs no update,
// otherwise by an upsert that inserts keys not yet known and moves
// last_seen (to the end of its keySeenStep: see keyIDCache). fresh holds the
// upserted ones, for the cache once tx commits.
func (s *Store) keyIDs(ctx context.Context, tx *sql.Tx, keys []usedKey, at map[flowKey]int) (fresh map[flowKey]cachedKeyID, err error) {
	miss := s.keyCache.lookup(keys, time.Now().UnixNano())
	// Upserted in a stable order, so concurrent writers take row locks
	// in the same order.
	slices.SortFunc(miss, func(a, b int) int { return keys[a].key.compare(keys[b].key) })
	found := 0
	read := func(rs *sql.Rows, err error) error {
		if err != nil {
			return err
		}
		for rs.Next() {
			var k flowKey
			var id int64
			var port int
			if err := rs.Scan(&id, &k.host, &k.dir, &k.proto, &k.local, &k.remote, &port, &k.comm, &k.peerComm); err != nil {
				rs.Close()
				return fmt.Errorf("read flow key: %w", err)
			}
			k.port = uint16(port)
			if j, ok := at[k]; ok && keys[j].id == 0 {
				keys[j].id = id
				found++
			}
		}
		return rs.Close()
	}
	if s.d.name == postgres.name && len(miss) > 0 {
		// One constant statement, a column of keys per array (see
		// upsertRows).
		text := make([][]string, 7)
		ports := make([]int32, 0, len(miss))
		seen := make([]int64, 0, len(miss))
		for _, j := range miss {
			k := &keys[j].key
			for i, v := range []string{k.host, k.dir, k.proto, k.local, k.remote, k.comm, k.peerComm} {
				text[i] = append(text[i], v)
			}
			ports = append(ports, int32(k.port))
			seen = append(seen, keySeenUpTo(keys[j].lastSeen))
		}
		q := `INSERT INTO flow_keys (` + keyColumns + `) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[], $8::text[], $9::bigint[])` + keysUpsert
		if err := read(tx.QueryContext(ctx, q, text[0], text[1], text[2], text[3], text[4], ports, text[5], text[6], seen)); err != nil {
			return nil, fmt.Errorf("write %d flow keys: %w", len(miss), err)
		}
	}
	for start := 0; start < len(miss) && s.d.name != postgres.name; {
		n := chunkRows(len(miss) - start)
		stmt, err := s.prepared(ctx, tx, writeShape{"flow_keys", n, 0})
		if err != nil {
			return nil, fmt.Errorf("write %d flow keys: %w", n, err)
		}
		args := make([]any, 0, n*9)
		for _, j := range miss[start : start+n] {
			k := &keys[j].key
			args = append(args, k.host, k.dir, k.proto, k.local, k.remote, int(k.port), k.comm, k.peerComm, keySeenUpTo(keys[j].lastSeen))
		}
		if err := read(stmt.QueryContext(ctx, args...)); err != nil {
			return nil, fmt.Errorf("write %d flow keys: %w", n, err)
		}
		start += n
	}
	if found != len(miss) {
		for _, j := range miss {
			if keys[j].id == 0 {
				return nil, fmt.Errorf("write flow keys: no id returned for %+v", keys[j].key)
			}
		}
	}
	fresh = make(map[flowKey]cachedKeyID, len(miss))
	for _, j := range miss {
		fresh[keys[j].key] = cachedKeyID{id: keys[j].id, upTo: keySeenUpTo(keys[j].lastSeen)}
	}
	return fresh, nil
}

// upsertRows adds rows to level l's table: rows are first merged per
// (bucket of l, key), since one statement may not update a row twice.
func (s *Store) upsertRows(ctx context.Context, tx *sql.Tx, l level, rows []flowRow) error {
	if len(rows) == 0 {
		return nil
	}
	type rk struct{ bucket, key int64 }
	at := make(map[rk]int, len(rows)) // index in merged
	merged := make([]flowRow, 0, len(rows))
	for _, r := range rows {
		r.bucket = floorTo(r.bucket, l.width)
		k := rk{r.bucket, r.key}
		if i, ok := at[k]; ok {
			merged[i].add(r)
			continue
		}
		at[k] = len(merged)
		merged = append(merged, r)
	}
	// In (bucket, key) order: PostgreSQL writes them so, so that
	// concurrent writers take row locks in one order; SQLite groups them
	// by columns below, keeping the order within a group. Sorted through
	// indices: moving the rows (200 bytes each) was a twentieth of an
	// agent's write.
	order := make([]int, len(merged))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		x, y := &merged[a], &merged[b]
		if x.bucket != y.bucket {
			return compareInt(x.bucket, y.bucket)
		}
		return compareInt(x.key, y.key)
	})
	ncol := 6 + len(counterColumns)
	if s.d.name == postgres.name {
		// One statement whatever the number of rows: a column of the
		// new rows per array, so the text is constant (pgx prepares it
		// once per connection) and nothing parses thousands of
		// placeholders.
		colArgs := make([][]int64, ncol)
		for i := range colArgs {
			colArgs[i] = make([]int64, 0, len(merged))
		}
		for _, i := range order {
			r := &merged[i]
			vals := append([]int64{r.bucket, r.key, int64(r.pid), int64(r.peer)}, make([]int64, len(counterColumns))...)
			for i, v := range counterFields(&r.c) {
				vals[4+i] = int64(*v)
			}
			vals = append(vals, r.first, r.last)
			for i, v := range vals {
				colArgs[i] = append(colArgs[i], v)
			}
		}
		args := make([]any, ncol)
		unnest := make([]string, ncol)
		for i := range colArgs {
			args[i] = colArgs[i]
			unnest[i] = fmt.Sprintf("$%d::bigint[]", i+1)
		}
		q := "INSERT INTO " + l.table + " (" + rowColumns + ") SELECT * FROM unnest(" + strings.Join(unnest, ", ") + ") ON CONFLICT (bucket, key_id) DO UPDATE SET " + upsertSet(l.table)
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("write %d rows to %s: %w", len(merged), l.table, err)
		}
		return nil
	}
	// SQLite: statements of 256, 128, ... 1 rows, each prepared once per
	// open store, so that the parser (a third of the write's time when
	// every batch had a statement of its own) runs once. Rows are grouped
	// by the counter columns they fill, and a statement writes only those
	// (see colMask): a short-lived TCP row fills 7 to 10 of the 20.
	masks := make([]colMask, len(merged))
	for i := range merged {
		masks[i] = filledColumns(&merged[i].c)
	}
	slices.SortStableFunc(order, func(a, b int) int { return compareInt(int64(masks[a]), int64(masks[b])) })
	args := make([]any, 0, chunkRows(len(merged))*ncol) // reused: database/sql copies them
	for start := 0; start < len(order); {
		end := start + 1
		for end < len(order) && masks[order[end]] == masks[order[start]] {
			end++
		}
		for end-start > 0 {
			n := chunkRows(end - start)
			stmt, cols, err := s.preparedRows(ctx, tx, writeShape{l.table, n, masks[order[start]]})
			if err != nil {
				return fmt.Errorf("write %d rows to %s: %w", n, l.table, err)
			}
			args = args[:0]
			for _, i := range order[start : start+n] {
				r := &merged[i]
				args = append(args, r.bucket, r.key, int64(r.pid), int64(r.peer))
				for c, v := range counterFields(&r.c) {
					if cols&(1<<c) != 0 {
						args = append(args, int64(*v))
					}
				}
				args = append(args, r.first, r.last)
			}
			if _, err := stmt.ExecContext(ctx, args...); err != nil {
				return fmt.Errorf("write %d rows to %s: %w", n, l.table, err)
			}
			start += n
		}
	}
	return nil
}

// chunkRows is the number of rows of the next SQLite statement: a power
// of two, at most 256, so that few statement shapes exist.
func chunkRows(left int) int {
	n := 256
	for n > left {
		n /= 2
	}
	return n
}

// writeShape names a write statement: n rows into table (flow_keys: the
// key upsert, keysInsert; a flow bucket table: rowsInsert, writing the
// counter columns of cols). Statements are looked up by shape, so a write
// builds no text.
type writeShape struct {
	table string
	rows  int
	cols  colMask
}

func (sh writeShape) sql() string {
	if sh.table == "flow_keys" {
		return keysInsert(sh.rows)
	}
	return rowsInsert(sh.table, sh.rows, sh.cols)
}

// colMask names counter columns: bit i is counterColumns[i]. A row write
// may leave out a column that is 0 in each of its rows: the column then
// keeps its value (an update) or takes its default 0 (an insert), which
// is what adding a 0 does, and what a 0 does to a maximum or to the
// minimum of non-zero values.
type colMask uint32

// everyCounter names every counter column.
var everyCounter = colMask(1)<<len(counterColumns) - 1

// filledColumns names c's non-zero counters.
func filledColumns(c *tracer.Counters) colMask {
	var m colMask
	for i, v := range counterFields(c) {
		if *v != 0 {
			m |= 1 << i
		}
	}
	return m
}

// maxColumnSets bounds the sets of counter columns (over every table)
// one open store keeps row statements for beyond the statement of every
// column: the sets are data (a host with every mix of failures could make
// thousands), and SQLite's program for one set in its nine sizes (1 to
// 256 rows) takes about 1.5 MiB, outside Go's heap. An agent's rows fill
// a few sets (client and server rows, failures), in the minute table:
// the hour and day tables take only the rows of minutes already closed.
const maxColumnSets = 8

// columnSet is a table's row statements of the same counter columns.
type columnSet struct {
	table string
	cols  colMask
}

// prepared returns sh's statement bound to tx: prepared once per open
// store by prepareWrites, or (a shape it did not prepare) prepared for tx
// alone.
func (s *Store) prepared(ctx context.Context, tx *sql.Tx, sh writeShape) (*sql.Stmt, error) {
	s.stmtMu.Lock()
	st := s.stmts[sh]
	s.stmtMu.Unlock()
	if st == nil {
		return tx.PrepareContext(ctx, s.d.rebind(sh.sql()))
	}
	return tx.StmtContext(ctx, st), nil
}

// preparedRows returns a row statement for sh bound to tx, and the
// counter columns it writes: sh's own once prepared, until then the one
// of every column (sh is then noted, for prepareWrites to prepare before
// the next write: a statement cannot be prepared for the store while tx
// holds SQLite's one connection).
func (s *Store) preparedRows(ctx context.Context, tx *sql.Tx, sh writeShape) (*sql.Stmt, colMask, error) {
	s.stmtMu.Lock()
	st := s.stmts[sh]
	if st == nil {
		if s.stmtsWanted == nil {
			s.stmtsWanted = map[writeShape]bool{}
		}
		s.stmtsWanted[sh] = true
		sh.cols = everyCounter
	}
	s.stmtMu.Unlock()
	if st == nil {
		st, err := s.prepared(ctx, tx, sh)
		return st, sh.cols, err
	}
	return tx.StmtContext(ctx, st), sh.cols, nil
}

// prepareWrites prepares, once per open SQLite store, every statement
// shape the writes use (keys and each level's rows of every column, 1 to
// 256 rows per statement), and before each write the row shapes the last
// writes noted (preparedRows) of the column sets admitted: a set is
// admitted when writes wanted it twice, up to maxColumnSets, so that one
// burst of unusual rows does not take the places of the usual ones.
//
// It runs outside any transaction (SQLite has one connection, which a
// transaction holds) and prepares without holding stmtMu, which a writer
// inside its transaction may wait for. A statement of some columns that
// fails to prepare is left out: the writes go on with the statement of
// every column, which stores the same.
func (s *Store) prepareWrites(ctx context.Context) error {
	if s.d.name == postgres.name {
		return nil
	}
	s.stmtMu.Lock()
	base := s.stmts == nil
	s.stmtMu.Unlock()
	if base {
		var shapes []writeShape
		for n := 1; n <= 256; n *= 2 {
			shapes = append(shapes, writeShape{"flow_keys", n, 0})
			for _, l := range levels {
				shapes = append(shapes, writeShape{l.table, n, everyCounter})
			}
		}
		stmts, err := s.prepareShapes(ctx, shapes)
		if err != nil {
			return fmt.Errorf("prepare writes: %w", err)
		}
		s.adoptStatements(stmts, true)
	}
	s.stmtMu.Lock()
	var todo []writeShape
	if len(s.stmtsWanted) > 0 && s.stmts != nil {
		if s.columnSets == nil {
			s.columnSets, s.setsWanted, s.setsPreparing = map[columnSet]bool{}, map[columnSet]int{}, map[columnSet]int{}
		}
		counted := map[columnSet]bool{}
		for sh := range s.stmtsWanted {
			set := columnSet{sh.table, sh.cols}
			if s.stmts[sh] != nil {
				continue
			}
			if !s.columnSets[set] {
				if len(s.columnSets) >= maxColumnSets {
					continue
				}
				if !counted[set] {
					counted[set] = true
					s.setsWanted[set]++
				}
				if s.setsWanted[set] < 2 {
					continue
				}
				s.columnSets[set] = true
				delete(s.setsWanted, set)
			}
			todo = append(todo, sh)
		}
		clear(s.stmtsWanted)
		if len(s.setsWanted) > 4*maxColumnSets {
			// Forget the sets this round did not want: they do not recur.
			for set := range s.setsWanted {
				if !counted[set] {
					delete(s.setsWanted, set)
				}
			}
		}
	}
	var bySet map[columnSet][]writeShape // nil, as a rule: nothing to prepare
	if len(todo) > 0 {
		bySet = map[columnSet][]writeShape{}
	}
	for _, sh := range todo {
		set := columnSet{sh.table, sh.cols}
		if bySet[set] == nil {
			s.setsPreparing[set]++
		}
		bySet[set] = append(bySet[set], sh)
	}
	s.stmtMu.Unlock()
	for set, shapes := range bySet {
		prepared := false
		for _, sh := range shapes {
			if stmts, err := s.prepareShapes(ctx, []writeShape{sh}); err == nil {
				s.adoptStatements(stmts, false)
				prepared = true
			}
		}
		s.donePreparing(set, prepared)
	}
	return nil
}

// donePreparing ends a prepareWrites' work on set, and gives set's place
// back when none of its statements could be prepared and no other writer
// is preparing one: writes may want it again, or another set.
func (s *Store) donePreparing(set columnSet, prepared bool) {
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if s.setsPreparing[set]--; s.setsPreparing[set] > 0 {
		return
	}
	delete(s.setsPreparing, set)
	if prepared {
		return
	}
	for sh := range s.stmts {
		if sh.table == set.table && sh.cols == set.cols {
			return
		}
	}
	delete(s.columnSets, set)
}

// prepareShapes prepares shapes for the store, all or none.
func (s *Store) prepareShapes(ctx context.Context, shapes []writeShape) (map[writeShape]*sql.Stmt, error) {
	stmts := make(map[writeShape]*sql.Stmt, len(shapes))
	for _, sh := range shapes {
		st, err := s.db.PrepareContext(ctx, s.d.rebind(sh.sql()))
		if err == nil && testHooks.failPrepare != nil && testHooks.failPrepare(sh) {
			st.Close()
			err = errors.New("prepare failed (test hook)")
		}
		if err != nil {
			for _, st := range stmts {
				st.Close()
			}
			return nil, err
		}
		stmts[sh] = st
	}
	return stmts, nil
}

// adoptStatements adds stmts to the store's, base being the first set:
// one another writer prepared meanwhile, or any after Close, is closed.
func (s *Store) adoptStatements(stmts map[writeShape]*sql.Stmt, base bool) {
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if base && s.stmts == nil && !s.closed {
		s.stmts = stmts
		return
	}
	for sh, st := range stmts {
		if s.stmts == nil || s.stmts[sh] != nil {
			st.Close()
			continue
		}
		s.stmts[sh] = st
	}
}

// rowColumns are the columns a write gives a flow bucket table.
var rowColumns = columnsOf(everyCounter)

// columnsOf lists a row write's columns, of the counters those of cols.
func columnsOf(cols colMask) string {
	names := []string{"bucket", "key_id", "pid", "peer_pid"}
	for i, c := range counterColumns {
		if cols&(1<<i) != 0 {
			names = append(names, c)
		}
	}
	return strings.Join(append(names, "first_seen", "last_seen"), ", ")
}

// rowsInsert adds n rows to the flow bucket table t, writing the counter
// columns of cols (SQLite).
func rowsInsert(t string, n int, cols colMask) string {
	columns := columnsOf(cols)
	row := "(" + strings.TrimSuffix(strings.Repeat("?, ", strings.Count(columns, ",")+1), ", ") + ")"
	return "INSERT INTO " + t + " (" + columns + ") VALUES " + strings.TrimSuffix(strings.Repeat(row+", ", n), ", ") +
		" ON CONFLICT (bucket, key_id) DO UPDATE SET " + upsertSetOf(t, cols)
}

// keysInsert adds n flow keys and returns their ids (SQLite). DO UPDATE
// (not DO NOTHING) so that RETURNING names existing keys too, and so that
// retention sees the key as recent.
func keysInsert(n int) string {
	return `INSERT INTO flow_keys (` + keyColumns + `) VALUES ` + strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?, ?, ?), ", n), ", ") + keysUpsert
}

const keyColumns = `host_id, direction, proto, local_addr, remote_addr, port, comm, peer_comm, last_seen`

const keysUpsert = ` ON CONFLICT (host_id, direction, proto, local_addr, remote_addr, port, comm, peer_comm) DO UPDATE SET
			last_seen = CASE WHEN excluded.last_seen > flow_keys.last_seen THEN excluded.last_seen ELSE flow_keys.last_seen END
			RETURNING id, host_id, direction, proto, local_addr, remote_addr, port, comm, peer_comm`

// upsertSet is the ON CONFLICT update of a flow bucket table t: maximum
// of the pids and of the maxima, minimum of the non-zero RTT minima,
// sums, earliest first and latest last seen.
func upsertSet(t string) string { return upsertSetOf(t, everyCounter) }

// upsertSetOf is upsertSet of the counter columns of cols.
func upsertSetOf(t string, cols colMask) string {
	var set strings.Builder
	fmt.Fprintf(&set, "pid = CASE WHEN excluded.pid > %[1]s.pid THEN excluded.pid ELSE %[1]s.pid END,\n", t)
	fmt.Fprintf(&set, "peer_pid = CASE WHEN excluded.peer_pid > %[1]s.peer_pid THEN excluded.peer_pid ELSE %[1]s.peer_pid END,\n", t)
	for i, c := range counterColumns {
		if cols&(1<<i) == 0 {
			continue
		}
		if maxColumns[c] {
			fmt.Fprintf(&set, "%[2]s = CASE WHEN excluded.%[2]s > %[1]s.%[2]s THEN excluded.%[2]s ELSE %[1]s.%[2]s END,\n", t, c)
		} else if minColumns[c] {
			fmt.Fprintf(&set, "%[2]s = CASE WHEN excluded.%[2]s = 0 THEN %[1]s.%[2]s WHEN %[1]s.%[2]s = 0 OR excluded.%[2]s < %[1]s.%[2]s THEN excluded.%[2]s ELSE %[1]s.%[2]s END,\n", t, c)
		} else {
			fmt.Fprintf(&set, "%[2]s = %[1]s.%[2]s + excluded.%[2]s,\n", t, c)
		}
	}
	fmt.Fprintf(&set, `first_seen = CASE WHEN excluded.first_seen < %[1]s.first_seen THEN excluded.first_seen ELSE %[1]s.first_seen END,
		last_seen = CASE WHEN excluded.last_seen > %[1]s.last_seen THEN excluded.last_seen ELSE %[1]s.last_seen END`, t)
	return set.String()
}

// writeNames keeps, per flow key, the latest non-empty remote name of
// obs (by last seen; of two seen at once, the later written); rows[i] is
// obs[i]'s minute row, which names its key's id.
func (s *Store) writeNames(ctx context.Context, tx *sql.Tx, obs []Observation, rows []flowRow) error {
	type named struct {
		name string
		seen int64
	}
	latest := map[int64]named{}
	for i := range obs {
		o := &obs[i]
		if o.RemoteName == "" {
			continue
		}
		id, seen := rows[i].key, max(ns(o.LastSeen), ns(o.Bucket))
		if n, ok := latest[id]; !ok || seen >= n.seen {
			latest[id] = named{o.RemoteName, seen}
		}
	}
	if len(latest) == 0 {
		return nil
	}
	keys := make([]int64, 0, len(latest))
	for id := range latest {
		keys = append(keys, id)
	}
	slices.Sort(keys)
	const chunk = 200
	for start := 0; start < len(keys); start += chunk {
		part := keys[start:min(start+chunk, len(keys))]
		args := make([]any, 0, 3*len(part))
		for _, id := range part {
			args = append(args, id, latest[id].name, latest[id].seen)
		}
		q := `INSERT INTO flow_names (key_id, name, seen) VALUES ` + strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", len(part)), ", ") + `
			ON CONFLICT (key_id) DO UPDATE SET
				name = CASE WHEN excluded.seen >= flow_names.seen THEN excluded.name ELSE flow_names.name END,
				seen = CASE WHEN excluded.seen > flow_names.seen THEN excluded.seen ELSE flow_names.seen END`
		if _, err := tx.ExecContext(ctx, s.d.rebind(q), args...); err != nil {
			return fmt.Errorf("write %d remote names: %w", len(part), err)
		}
	}
	return nil
}

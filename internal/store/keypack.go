package store

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"slices"
	"unsafe"
)

// The key pack (schema 8): every flow key, sorted in key order, packed
// into one row of key_pack, so that a cold query names its flows without
// reading one 9-column row per flow and sorts them by their place in the
// pack instead of comparing strings. Compaction rebuilds it when enough
// keys were added since; keys are never changed (only their last_seen,
// which is not packed), so a pack stays right until retention deletes
// keys, which deletes the pack in the same transaction (SQLite may give a
// deleted key's id to a new key). Keys added since the pack was built are
// read by id.

// keyPack is a decoded pack: keys in key order, and each id's place.
type keyPack struct {
	keys  []flowKey
	ids   []int64
	dense []int32 // id -> 1 + place; 0: not packed
	other map[int64]int32
	maxID int64
}

func (p *keyPack) place(id int64) (int32, bool) {
	if id >= 0 && id < int64(len(p.dense)) {
		i := p.dense[id]
		return i - 1, i > 0
	}
	i, ok := p.other[id]
	return i, ok
}

// encodeKeyPack packs keys (in key order): a format byte, the count, then
// per key its id and port as uvarints and its seven strings, each a
// uvarint length and the bytes.
func encodeKeyPack(ids []int64, keys []flowKey) []byte {
	out := []byte{pieceFormat}
	out = binary.AppendUvarint(out, uint64(len(keys)))
	for i, k := range keys {
		out = binary.AppendUvarint(out, uint64(ids[i]))
		out = binary.AppendUvarint(out, uint64(k.port))
		for _, s := range []string{k.host, k.dir, k.proto, k.local, k.remote, k.comm, k.peerComm} {
			out = binary.AppendUvarint(out, uint64(len(s)))
			out = append(out, s...)
		}
	}
	return out
}

// decodeKeyPack unpacks a pack. The keys' strings point into one copy of
// data (one allocation for all of them).
func decodeKeyPack(data []byte) (*keyPack, error) {
	bad := func(what string) (*keyPack, error) { return nil, fmt.Errorf("malformed key pack: %s", what) }
	if len(data) == 0 || data[0] != pieceFormat {
		return bad("unknown format")
	}
	own := slices.Clone(data[1:])
	n, k := binary.Uvarint(own)
	if k <= 0 || n > uint64(len(own)) {
		return bad("key count")
	}
	own = own[k:]
	p := &keyPack{keys: make([]flowKey, n), ids: make([]int64, n), other: map[int64]int32{}}
	next := func() (uint64, bool) {
		v, k := binary.Uvarint(own)
		if k <= 0 {
			return 0, false
		}
		own = own[k:]
		return v, true
	}
	for i := range p.keys {
		id, ok1 := next()
		port, ok2 := next()
		if !ok1 || !ok2 || port > 65535 {
			return bad("id or port")
		}
		k := &p.keys[i]
		k.port = uint16(port)
		for _, dst := range []*string{&k.host, &k.dir, &k.proto, &k.local, &k.remote, &k.comm, &k.peerComm} {
			l, ok := next()
			if !ok || l > uint64(len(own)) {
				return bad("string")
			}
			if l > 0 {
				*dst = unsafe.String(&own[0], int(l))
			}
			own = own[l:]
		}
		p.ids[i] = int64(id)
		p.maxID = max(p.maxID, int64(id))
	}
	if len(own) != 0 {
		return bad("bytes left over")
	}
	if p.maxID < denseKeys {
		p.dense = make([]int32, p.maxID+1)
	}
	for i, id := range p.ids {
		if id < int64(len(p.dense)) {
			p.dense[id] = int32(i + 1)
		} else {
			p.other[id] = int32(i)
		}
	}
	return p, nil
}

// packKeys rebuilds the key pack when there is none or when the keys
// added since it was built are at least 500 and a twentieth of it.
func (s *Store) packKeys(ctx context.Context) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if s.d.name != postgres.name {
			// The write lock first, so that what is read is the latest.
			if _, err := tx.ExecContext(ctx, `UPDATE piece_state SET done_through = done_through WHERE level = 0`); err != nil {
				return fmt.Errorf("pack flow keys: %w", err)
			}
		}
		var packed, maxID int64 = -1, -1
		err := tx.QueryRowContext(ctx, `SELECT keys, max_id FROM key_pack WHERE id = 1`).Scan(&packed, &maxID)
		if err != nil && err != sql.ErrNoRows {
			return fmt.Errorf("pack flow keys: %w", err)
		}
		if packed >= 0 {
			var added int64
			if err := tx.QueryRowContext(ctx, s.d.rebind(`SELECT COUNT(*) FROM flow_keys WHERE id > ?`), maxID).Scan(&added); err != nil {
				return fmt.Errorf("pack flow keys: %w", err)
			}
			if added < max(500, packed/20) {
				return nil
			}
		}
		rs, err := tx.QueryContext(ctx, `SELECT id, host_id, direction, proto, local_addr, remote_addr, port, comm, peer_comm FROM flow_keys`)
		if err != nil {
			return fmt.Errorf("pack flow keys: %w", err)
		}
		type idKey struct {
			id int64
			k  flowKey
		}
		var all []idKey
		for rs.Next() {
			var x idKey
			var port int
			if err := rs.Scan(&x.id, &x.k.host, &x.k.dir, &x.k.proto, &x.k.local, &x.k.remote, &port, &x.k.comm, &x.k.peerComm); err != nil {
				rs.Close()
				return fmt.Errorf("pack flow keys: %w", err)
			}
			x.k.port = uint16(port)
			all = append(all, x)
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return fmt.Errorf("pack flow keys: %w", err)
		}
		slices.SortFunc(all, func(a, b idKey) int { return a.k.compare(b.k) })
		ids := make([]int64, len(all))
		keys := make([]flowKey, len(all))
		maxID = 0
		for i, x := range all {
			ids[i], keys[i] = x.id, x.k
			maxID = max(maxID, x.id)
		}
		if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO key_pack (id, keys, max_id, data) VALUES (1, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET keys = excluded.keys, max_id = excluded.max_id, data = excluded.data`),
			int64(len(all)), maxID, encodeKeyPack(ids, keys)); err != nil {
			return fmt.Errorf("pack flow keys: %w", err)
		}
		return nil
	})
}

// namedObservations names the summed flows: by the key pack where it
// has them (sorted by their place in it), the others read by id (or,
// when many, with every key seen since lo) and placed among them by
// comparing keys.
func (sm *sums) namedObservations(rd reader, lo int64) ([]Observation, error) {
	pack, err := rd.keyPack()
	if err != nil {
		return nil, err
	}
	if pack == nil {
		keys := make(map[int64]flowKey, len(sm.flows))
		if err := rd.keys(lo, sm.has, func(id int64, k flowKey) { keys[id] = k }); err != nil {
			return nil, err
		}
		return sm.observations(keys)
	}
	var missing []int64
	for _, id := range sm.keys {
		if _, ok := pack.place(id); !ok {
			missing = append(missing, id)
		}
	}
	extra := map[int64]flowKey{}
	add := func(id int64, k flowKey) { extra[id] = k }
	if len(missing) > 2000 {
		err = rd.keys(lo, func(id int64) bool {
			_, packed := pack.place(id)
			return !packed && sm.has(id)
		}, add)
	} else if len(missing) > 0 {
		err = rd.keysByID(missing, add)
	}
	if err != nil {
		return nil, err
	}
	// A packed key's rank is 2*place+1; a key added since ranks 2*p,
	// p the place of the first packed key after it (ties: by key).
	type named struct {
		k    *flowKey
		i    int32
		rank int64
	}
	order := make([]named, len(sm.keys))
	for i, id := range sm.keys {
		if p, ok := pack.place(id); ok {
			order[i] = named{&pack.keys[p], int32(i), 2*int64(p) + 1}
			continue
		}
		k, ok := extra[id]
		if !ok {
			return nil, fmt.Errorf("read observations: flow key %d has counters but no key", id)
		}
		p, _ := slices.BinarySearchFunc(pack.keys, k, flowKey.compare)
		order[i] = named{&k, int32(i), 2 * int64(p)}
	}
	slices.SortFunc(order, func(a, b named) int {
		if a.rank != b.rank {
			return compareInt(a.rank, b.rank)
		}
		return a.k.compare(*b.k)
	})
	out := make([]Observation, len(order))
	for j, n := range order {
		sm.observation(&out[j], n.k, n.i)
	}
	return out, nil
}

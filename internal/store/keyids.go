package store

import (
	"sync"
	"time"
)

// keyIDCache remembers the ids of the flow keys this store wrote lately,
// so that a flow recurring every interval has its key upserted once in
// keySeenStep rather than once an interval (the upsert was 28 % of an
// agent's write with 1,000 client hosts when it ran every interval, 6 %
// of the whole agent once a minute). A key is written with its last_seen
// rounded up to the end of its keySeenStep; until an observation passes
// that, the key's row needs no update, and the cached id is the row's:
// readers use last_seen only as a bound ("seen since" lo: keysSQL,
// nameObservations: a later value only lets a range read a key with no
// rows in it) and retention deletes only keys unseen for a day and more,
// both of which a value at most keySeenStep late keeps right.
//
// An id can go stale only if its key is deleted (SQLite may then give the
// id to another key). Retention deletes keys unseen for more than a day,
// and an entry older than keyIDMaxAge is a miss, so no process's retention
// can delete a key whose entry is used. Retention in this process also
// clears the cache, and a write that read the cache before a clear does
// not put its ids back after it (gen).
type keyIDCache struct {
	mu    sync.Mutex
	ids   map[flowKey]cachedKeyID
	gen   uint64 // clears so far
	swept int64  // unix ns of the last sweep of old entries
}

type cachedKeyID struct {
	id   int64
	upTo int64 // the last_seen written: the end of a keySeenStep, unix ns
}

const (
	keyIDMaxAge = time.Hour
	// keyIDMaxEntries bounds the cache's memory (about 250 bytes an
	// entry, 64 MiB at most): past it new keys are not cached.
	keyIDMaxEntries = 1 << 18
)

// keySeenStep is the step a key's last_seen moves by: ten minutes, so
// that a key is upserted once in ten minutes while its flow recurs. A
// divisor of the hour and the day, and far below the day of retention.
const keySeenStep = 10 * time.Minute

// keySeenUpTo is the last_seen written for a key last seen at ns: the
// last nanosecond of its keySeenStep.
func keySeenUpTo(ns int64) int64 {
	return floorTo(ns, int64(keySeenStep)) + int64(keySeenStep) - 1
}

// generation is what a write records before it reads the cache, for add.
func (c *keyIDCache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// lookup sets the cached id of each of keys whose row needs no update
// for an event at its lastSeen (and whose entry is recent at now), and
// returns the indices of the others, to upsert.
func (c *keyIDCache) lookup(keys []usedKey, now int64) (miss []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for j := range keys {
		k := &keys[j]
		e, ok := c.ids[k.key]
		if !ok || k.lastSeen > e.upTo || e.upTo < now-int64(keyIDMaxAge) {
			miss = append(miss, j)
			continue
		}
		k.id = e.id
	}
	return miss
}

// add records ids written by a transaction that committed, with the
// last_seen each was written with; gen is the cache's generation when
// the write began: if it cleared since, the ids may be deleted ones.
func (c *keyIDCache) add(fresh map[flowKey]cachedKeyID, gen uint64, now int64) {
	if len(fresh) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if c.ids == nil {
		c.ids = make(map[flowKey]cachedKeyID, len(fresh))
	}
	if now-c.swept > int64(time.Minute) {
		c.swept = now
		for k, e := range c.ids {
			if e.upTo < now-int64(keyIDMaxAge) {
				delete(c.ids, k)
			}
		}
	}
	for k, e := range fresh {
		if e.upTo < now-int64(keyIDMaxAge) {
			continue // a replay of old batches is not worth keeping
		}
		if _, ok := c.ids[k]; !ok && len(c.ids) >= keyIDMaxEntries {
			continue
		}
		c.ids[k] = e
	}
}

// clear forgets every id: keys were deleted.
func (c *keyIDCache) clear() {
	c.mu.Lock()
	c.ids = nil
	c.gen++
	c.mu.Unlock()
}

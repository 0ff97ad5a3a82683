package store

import (
	"sync"
	"time"
)

// keyIDCache remembers the ids of the flow keys this store wrote lately,
// so that a flow recurring every interval has its key upserted once a
// minute rather than once an interval (the upsert was 28 % of an agent's
// write with 1,000 client hosts). A key is written with its last_seen
// rounded up to the end of its minute; until an observation passes that,
// the key's row needs no update, and the cached id is the row's: readers
// use last_seen only as a bound ("seen since lo": keysSQL,
// nameObservations) and retention deletes only keys unseen for a day and
// more, both of which a value at most a minute late keeps right.
//
// An id can go stale only if its key is deleted (SQLite may then give the
// id to another key): retention in this process clears the cache, and an
// entry older than keyIDMaxAge is dropped, far inside the day a key must
// be unseen before anyone's retention deletes it.
type keyIDCache struct {
	mu    sync.Mutex
	ids   map[flowKey]cachedKeyID
	swept int64 // unix ns of the last sweep of old entries
}

type cachedKeyID struct {
	id   int64
	upTo int64 // the last_seen written: the end of a minute, unix ns
}

const (
	keyIDMaxAge = time.Hour
	// keyIDMaxEntries bounds the cache's memory (about 250 bytes an
	// entry): past it the cache starts over.
	keyIDMaxEntries = 1 << 18
)

// keySeenUpTo is the last_seen written for a key last seen at ns: the
// last nanosecond of its minute.
func keySeenUpTo(ns int64) int64 { return floorTo(ns, int64(time.Minute)) + int64(time.Minute) - 1 }

// lookup returns the cached id of k if its row needs no update for an
// event at lastSeen.
func (c *keyIDCache) lookup(k flowKey, lastSeen int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.ids[k]
	if !ok || lastSeen > e.upTo {
		return 0, false
	}
	return e.id, true
}

// add records ids written by a committed transaction, with the last_seen
// each was written with.
func (c *keyIDCache) add(fresh map[flowKey]cachedKeyID, now int64) {
	if len(fresh) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ids == nil || len(c.ids)+len(fresh) > keyIDMaxEntries {
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
		if e.upTo >= now-int64(keyIDMaxAge) { // a replay of old batches is not worth keeping
			c.ids[k] = e
		}
	}
}

// clear forgets every id: keys were deleted.
func (c *keyIDCache) clear() {
	c.mu.Lock()
	c.ids = nil
	c.mu.Unlock()
}

package scrub

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"sync"
)

// DefaultCacheSize is the number of Sets a Cache keeps by default. A Set
// costs about 0.3 MiB per credential (its DFA: ~600 states, whatever the
// value's length) and about 1 ms of CPU per credential to compile
// (BenchmarkCompile), so the cache should hold every combination of injected
// values in use (one per credential version and injection rule, typically):
// 64 covers a large policy in a few tens of MiB.
const DefaultCacheSize = 64

// Cache keeps compiled Sets by the values they scrub, so the proxy compiles
// once per credential version instead of per request. Keys are SHA-256
// digests of the values, never the values. Safe for concurrent use; the least
// recently used Set is evicted beyond the size.
type Cache struct {
	mu   sync.Mutex
	size int
	byID map[[sha256.Size]byte]*list.Element
	lru  list.List // of *cacheEntry, most recent first
}

type cacheEntry struct {
	key [sha256.Size]byte
	set *Set
}

// NewCache returns a Cache holding at most size Sets (DefaultCacheSize when
// size < 1).
func NewCache(size int) *Cache {
	if size < 1 {
		size = DefaultCacheSize
	}
	return &Cache{size: size, byID: map[[sha256.Size]byte]*list.Element{}}
}

// Set returns the Set for values (in any order), compiling it on first use.
// Compiling runs outside the lock, so a slow compile delays no other lookup.
func (c *Cache) Set(values ...string) *Set {
	key := cacheKey(values)
	c.mu.Lock()
	if e, ok := c.byID[key]; ok {
		c.lru.MoveToFront(e)
		c.mu.Unlock()
		return e.Value.(*cacheEntry).set
	}
	c.mu.Unlock()
	s := Compile(values...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byID[key]; ok { // compiled meanwhile by another caller
		return e.Value.(*cacheEntry).set
	}
	c.byID[key] = c.lru.PushFront(&cacheEntry{key: key, set: s})
	for c.lru.Len() > c.size {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.byID, old.Value.(*cacheEntry).key)
	}
	return s
}

// Len returns the number of Sets held.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// cacheKey digests the sorted, length-prefixed values.
func cacheKey(values []string) [sha256.Size]byte {
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	h := sha256.New()
	for _, v := range sorted {
		_, _ = h.Write(binary.AppendUvarint(nil, uint64(len(v))))
		_, _ = h.Write([]byte(v))
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	return key
}

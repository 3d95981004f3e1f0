package hookauth

import (
	"container/heap"
	"sync"
)

// replayCache remembers every jti until its assertion can no longer verify, in at most
// max entries. When it is full of live entries it refuses new ones (ErrReplayCacheFull)
// rather than forget one that could then be replayed: it fails closed.
type replayCache struct {
	mu   sync.Mutex
	max  int
	seen map[string]int64 // jti -> Unix second after which it can no longer verify
	exp  expiryHeap
}

func newReplayCache(max int) *replayCache {
	return &replayCache{max: max, seen: map[string]int64{}}
}

// add records jti until `until`; it fails when jti is already recorded and still live.
func (c *replayCache) add(jti string, until, now int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.purge(now)
	if _, ok := c.seen[jti]; ok {
		return ErrReplay
	}
	if len(c.seen) >= c.max {
		return ErrReplayCacheFull
	}
	c.seen[jti] = until
	heap.Push(&c.exp, expiry{until, jti})
	return nil
}

// purge forgets the entries whose assertions have expired by now.
func (c *replayCache) purge(now int64) {
	for len(c.exp) > 0 && c.exp[0].until < now {
		e := heap.Pop(&c.exp).(expiry)
		delete(c.seen, e.jti)
	}
}

type expiry struct {
	until int64
	jti   string
}

// expiryHeap is a min-heap of expiries (container/heap).
type expiryHeap []expiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].until < h[j].until }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

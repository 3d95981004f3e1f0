package dnsguard

import (
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxClients bounds the per-client table. A sandbox has a handful of
// clients; a flood of spoofed source addresses beyond this shares one
// bucket (the overflow bucket) instead of growing the table.
const maxClients = 4096

// limiter holds one token bucket per client IP.
type limiter struct {
	limit rate.Limit
	burst int
	// idle is how long a bucket takes to refill completely: a client
	// unseen for longer loses nothing when its bucket is dropped.
	idle time.Duration

	mu        sync.Mutex
	clients   map[netip.Addr]*bucket
	overflow  *rate.Limiter
	lastSweep time.Time
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
}

func newLimiter(perSecond float64, burst int) *limiter {
	l := rate.Limit(perSecond)
	return &limiter{
		limit:    l,
		burst:    burst,
		idle:     time.Duration(float64(burst)/perSecond*float64(time.Second)) + time.Second,
		clients:  map[netip.Addr]*bucket{},
		overflow: rate.NewLimiter(l, burst),
	}
}

// allow takes a token from ip's bucket at now, reporting whether there was
// one.
func (l *limiter) allow(ip netip.Addr, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.lastSweep) > l.idle {
		l.sweep(now)
	}
	b, ok := l.clients[ip]
	if !ok {
		if len(l.clients) >= maxClients {
			l.sweep(now)
		}
		if len(l.clients) >= maxClients {
			return l.overflow.AllowN(now, 1)
		}
		b = &bucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.clients[ip] = b
	}
	b.seen = now
	return b.lim.AllowN(now, 1)
}

// sweep drops the buckets of clients idle long enough to be full again.
func (l *limiter) sweep(now time.Time) {
	l.lastSweep = now
	for ip, b := range l.clients {
		if now.Sub(b.seen) > l.idle {
			delete(l.clients, ip)
		}
	}
}

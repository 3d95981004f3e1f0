// Package membudget is egressd's one memory budget (limits.memory): every buffer
// a client can make egressd hold — each open connection (costs.go), a large request
// head being read, hook bodies, HTTP/2 receive windows — is reserved from it
// before it is allocated, and released when it is freed.
//
// Invariant: the bytes reserved never exceed the limit, except by a standing share
// (SetAside) taken while a smaller limit is installed. A reservation that does not
// fit is refused, never waited for: the holder that asked last is the one refused
// (with overloaded, by its caller), so what is already held keeps working and a
// flood cannot push egressd past its memory limit into an OOM kill.
//
// A budget may be a share of another (Share): what it reserves is reserved from
// its parent too, and refused when either is spent, as a cgroup's charge goes up
// its hierarchy. A node egressd gives each sandbox such a share of its own budget,
// so that the node's total stays bounded and no sandbox can spend more than its
// share of it (docs/node.md).
package membudget

import (
	"math"
	"sync/atomic"
)

// Holder names what a reservation holds; it labels egressd_memory_budget_bytes and
// the detail of a refusal (Detail).
type Holder uint8

// The holders. Hook bodies have a standing share (SetAside), the others reserve as
// they go.
const (
	Heads        Holder = iota // request heads beyond the connection's own read buffer
	HookBodies                 // hook request and decision bodies (limits.hook_buffer_bytes)
	H2Windows                  // HTTP/2 receive windows: intercepted clients' and upstreams'
	Conns                      // open connections, tunnels and requests in flight (costs.go)
	Placeholders               // request bodies read whole to replace placeholders in them
	Scrub                      // decoders and encoders of compressed responses being scrubbed
	AWSBodies                  // request bodies read whole to hash them for a SigV4 signature
	numHolders
)

var holderNames = [numHolders]string{"heads", "hook_bodies", "h2_windows", "conns", "placeholders", "scrub", "aws_bodies"}

func (h Holder) String() string { return holderNames[h] }

// Detail is the refusal detail of a reservation for h that did not fit.
func (h Holder) Detail() string { return "memory_" + holderNames[h] }

// Holders lists every holder, for exporting each from the start.
func Holders() []Holder {
	hs := make([]Holder, numHolders)
	for i := range hs {
		hs[i] = Holder(i)
	}
	return hs
}

// Budget is a limit in bytes and what each holder has reserved of it. A nil
// *Budget grants every reservation (tests that build parts of egressd alone).
// Safe for concurrent use.
type Budget struct {
	parent *Budget // nil: a root budget
	limit  atomic.Int64
	used   atomic.Int64
	held   [numHolders]atomic.Int64
	caps   [numHolders]atomic.Int64 // 0: none
	// refused counts the reservations refused because this budget was spent.
	refused atomic.Int64
}

// New returns a budget of limit bytes.
func New(limit int64) *Budget {
	b := &Budget{}
	b.limit.Store(limit)
	return b
}

// Share returns a budget of limit bytes that reserves from b too: a reservation
// is refused when either is spent. Its caps and standing shares (SetCap,
// SetAside) are its own; b's caps bound what every share reserves together.
func (b *Budget) Share(limit int64) *Budget {
	s := New(limit)
	s.parent = b
	return s
}

// Reserve takes n bytes for h, or reports false (taking nothing) when they do not
// fit beside what is already reserved, or past h's cap, here or in the budget
// this one is a share of.
func (b *Budget) Reserve(h Holder, n int64) bool { return b.TryReserve(h, n) == "" }

// TryReserve is Reserve that names the budget that refused: "" when the bytes
// were reserved, h's Detail when this budget was spent, and the parent's detail
// prefixed "node_" when the budget this one is a share of was (node mode).
func (b *Budget) TryReserve(h Holder, n int64) (refused string) {
	if b == nil || n <= 0 {
		return ""
	}
	if !b.reserveOwn(h, n) {
		b.refused.Add(1)
		return h.Detail()
	}
	if b.parent == nil {
		return ""
	}
	if d := b.parent.TryReserve(h, n); d != "" {
		b.release(h, n)
		return "node_" + d
	}
	return ""
}

// reserveOwn is Reserve within b alone.
func (b *Budget) reserveOwn(h Holder, n int64) bool {
	if held := b.held[h].Add(n); b.caps[h].Load() > 0 && held > b.caps[h].Load() {
		b.held[h].Add(-n)
		return false
	}
	for {
		used := b.used.Load()
		if used+n > b.limit.Load() {
			b.held[h].Add(-n)
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// Take takes n bytes for h even past the limit: for what must not be refused
// (the runtime's own connections), so that what comes next is refused sooner.
func (b *Budget) Take(h Holder, n int64) {
	for ; b != nil && n > 0; b = b.parent {
		b.held[h].Add(n)
		b.used.Add(n)
	}
}

// Room is what is left to reserve (0 when the budget, or the one it is a share
// of, is spent).
func (b *Budget) Room() int64 {
	if b == nil {
		return math.MaxInt64
	}
	return min(max(b.limit.Load()-b.used.Load(), 0), b.parent.Room())
}

// Refused is how many reservations were refused because this budget, not the one
// it is a share of, was spent.
func (b *Budget) Refused() int64 {
	if b == nil {
		return 0
	}
	return b.refused.Load()
}

// SetCap bounds what h may reserve to n bytes of the budget (0: no bound beyond
// the budget's), so that no one holder can take what the others need.
func (b *Budget) SetCap(h Holder, n int64) {
	if b != nil {
		b.caps[h].Store(n)
	}
}

// Release gives back n bytes h reserved.
func (b *Budget) Release(h Holder, n int64) {
	for ; b != nil && n > 0; b = b.parent {
		b.release(h, n)
	}
}

// release is Release within b alone.
func (b *Budget) release(h Holder, n int64) {
	b.held[h].Add(-n)
	b.used.Add(-n)
}

// SetAside makes h's standing share n bytes, replacing the one it had: the share
// is taken even past the limit (a reload that lowers it), and the other holders'
// reservations are then refused until enough is released. The share's own bound
// is its holder's business (hook bodies: limits.hook_buffer_bytes). In a share
// (Share) it is set aside within the share alone: what the holder really holds
// is reserved from the parent's own standing share.
func (b *Budget) SetAside(h Holder, n int64) {
	if b == nil {
		return
	}
	old := b.held[h].Swap(n)
	b.used.Add(n - old)
}

// Held is what h has reserved (or set aside).
func (b *Budget) Held(h Holder) int64 {
	if b == nil {
		return 0
	}
	return b.held[h].Load()
}

// Used is what every holder has reserved.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Limit is the budget's size in bytes.
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit.Load()
}

// SetLimit installs a new size (a reload). What is held stays held; new
// reservations are measured against the new size.
func (b *Budget) SetLimit(n int64) {
	if b != nil {
		b.limit.Store(n)
	}
}

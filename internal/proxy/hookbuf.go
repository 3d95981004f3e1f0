package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
)

// hookBudget bounds the bytes of every hook body egressd holds in memory at once,
// process-wide (limits.hook_buffer_bytes): requests, which egressd reads whole to
// sign them, and decisions, which it reads whole to check them. Each buffer is
// reserved before it is allocated, so many large or stalled hook bodies, on any
// number of connections and HTTP/2 streams, cost at most the budget. Past it a
// call fails with overloaded: the fail-closed deny for a pre-tool call, 503 for
// anything else.
//
// A body is reserved as its bytes arrive, not by the length it declares: a call
// that declares a megabyte and sends one byte holds one hookChunk, so forty such
// calls cannot take a 32 MiB budget from real calls. And one client (a source
// address on a listener) holds at most half of the budget: a client that sends
// the bytes to fill it still leaves a client of its own to the runtime, when the
// runtime has one (another address, or a hooks listener).
//
// A released buffer still counts (as garbage) until egressd has forced a garbage
// collection: otherwise the collector's pacing (the heap may grow to twice what is
// live before it runs) would let a stream of hook bodies cost twice the budget.
// A reservation that only garbage stands in the way of runs that collection first
// (one at a time); under an attack that is about one per budget's worth of bodies.
type hookBudget struct {
	limit   atomic.Int64
	used    atomic.Int64 // reserved by calls in progress
	garbage atomic.Int64 // released since the last forced collection
	gcMu    sync.Mutex
	gcGen   atomic.Int64 // collections so far
	// shares holds what each client has reserved (by hookClient).
	sharesMu sync.Mutex
	shares   map[string]int64
	// parent, in a node-mode sandbox's Server, is the node's hook buffer: every
	// byte is reserved from it too, as client key (the sandbox), so that each
	// sandbox holds at most half of the node's.
	parent *hookBudget
	key    string
}

// detailHookBuffer is the log detail of a hook call refused for the budget.
const detailHookBuffer = "hook_buffer"

var errHookBuffer = errors.New("limits.hook_buffer_bytes reached: too many hook bodies buffered at once")

// reserve takes n bytes of the budget for client, or reports false when they do
// not fit in the budget or the client's share, collecting the garbage first when
// that would make them fit.
func (b *hookBudget) reserve(client string, n int64) bool {
	if !b.takeShare(client, n) {
		return false
	}
	ok := b.tryReserve(n)
	if !ok && b.used.Load()+n <= b.limit.Load() && b.garbage.Load() > 0 {
		b.collect()
		ok = b.tryReserve(n)
	}
	if ok && b.parent != nil && !b.parent.reserve(b.key, n) {
		b.used.Add(-n)
		ok = false
	}
	if !ok {
		b.giveShare(client, n)
	}
	return ok
}

// takeShare takes n bytes of client's share: half the budget.
func (b *hookBudget) takeShare(client string, n int64) bool {
	b.sharesMu.Lock()
	defer b.sharesMu.Unlock()
	if b.shares[client]+n > b.limit.Load()/2 {
		return false
	}
	if b.shares == nil {
		b.shares = map[string]int64{}
	}
	b.shares[client] += n
	return true
}

func (b *hookBudget) giveShare(client string, n int64) {
	b.sharesMu.Lock()
	defer b.sharesMu.Unlock()
	if b.shares[client] -= n; b.shares[client] <= 0 {
		delete(b.shares, client)
	}
}

func (b *hookBudget) tryReserve(n int64) bool {
	for {
		used := b.used.Load()
		if used+b.garbage.Load()+n > b.limit.Load() {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// collect frees the garbage released so far. A caller that waited for another's
// collection returns without starting one of its own: a hook call waits for at
// most one collection.
func (b *hookBudget) collect() {
	gen := b.gcGen.Load()
	b.gcMu.Lock()
	defer b.gcMu.Unlock()
	if b.gcGen.Load() != gen {
		return
	}
	g := b.garbage.Load()
	runtime.GC()
	b.garbage.Add(-g)
	b.gcGen.Add(1)
}

// release returns n bytes of client's reservation: as garbage, or straight to
// the kernel when unmapped.
func (b *hookBudget) release(client string, n int64, unmapped bool) {
	b.used.Add(-n)
	if !unmapped {
		b.garbage.Add(n)
	}
	b.giveShare(client, n)
	if b.parent != nil {
		b.parent.release(b.key, n, unmapped)
	}
}

// hookClient is a hook call's client for the budget's shares: its source
// address on its listener.
func hookClient(rec *Record) string {
	host, _, err := net.SplitHostPort(rec.Client)
	if err != nil {
		host = rec.Client
	}
	return rec.Listener + " " + host
}

// hookChunk is the first reservation for a body; it doubles as the body's bytes
// arrive, up to the declared length when there is one.
const hookChunk = 32 << 10

// hookBuffer is one hook body read into reserved memory. Release returns the
// reservation once the bytes are no longer needed.
//
// A buffer of mmapMin bytes or more is mapped from the kernel rather than taken
// from the Go heap, and unmapped on release: its memory leaves the process at
// once, and it never inflates the collector's heap goal (a heap holding a full
// budget of hook bodies may otherwise grow to twice that before it collects).
// Nothing may read it after release: the forwarded request body reads it through
// reader, which stops at release, and the decision is copied out.
type hookBuffer struct {
	b        *hookBudget
	client   string // hookClient
	reserved int64
	mu       sync.Mutex
	mapped   []byte // the current mapping, when the buffer is one
	freed    bool
}

// mmapMin is the smallest buffer mapped from the kernel; smaller ones (a real
// runtime's tool calls, about a kilobyte) come from the heap.
const mmapMin = 64 << 10

func (h *hookBuffer) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.freed = true
	if h.mapped != nil {
		unix.Munmap(h.mapped)
		h.give(int64(len(h.mapped)), true) // returned to the kernel: no garbage
		h.mapped = nil
	}
	h.give(h.reserved, false)
}

// give returns n bytes of h's reservation.
func (h *hookBuffer) give(n int64, unmapped bool) {
	h.b.release(h.client, n, unmapped)
	h.reserved -= n
}

// reader reads body, which h holds, until h is released.
func (h *hookBuffer) reader(body []byte) io.Reader {
	return &heldReader{h: h, r: bytes.NewReader(body)}
}

type heldReader struct {
	h *hookBuffer
	r *bytes.Reader
}

func (r *heldReader) Read(p []byte) (int, error) {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if r.h.freed {
		return 0, errHookBufferReleased
	}
	return r.r.Read(p)
}

var errHookBufferReleased = errors.New("hook body read after the call ended")

// read reads r to its end, or to limit+1 bytes (the caller tells "too large" from
// the length), reserving every byte of capacity before allocating it. hint is the
// declared length, or -1: it caps the buffer's growth (a body of the declared
// length fits at once when its bytes have come), never its first reservation.
func (h *hookBuffer) read(r io.Reader, limit, hint int64) ([]byte, error) {
	most := limit + 1
	if hint >= 0 {
		most = min(most, hint+1) // +1: room to read the EOF, or one byte too many
	}
	buf, err := h.grow(nil, min(hookChunk, most))
	for err == nil {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return buf, nil
			}
			next := min(2*int64(cap(buf)), limit+1)
			if int64(cap(buf)) < most {
				next = min(next, most)
			}
			if buf, err = h.grow(buf, next); err != nil {
				break
			}
		}
		var n int
		n, err = r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
	}
	if err == io.EOF {
		return buf, nil
	}
	return buf, err
}

// grow returns buf with capacity size, reserved first. The buffer it replaces is
// released: unmapped, or counted as garbage until the next forced collection.
func (h *hookBuffer) grow(buf []byte, size int64) ([]byte, error) {
	if !h.b.reserve(h.client, size) {
		return buf, &refusal{Reason: allowlist.ReasonOverloaded, Detail: detailHookBuffer, Err: errHookBuffer}
	}
	h.reserved += size
	var grown, mapped []byte
	if size < mmapMin {
		grown = make([]byte, len(buf), size)
	} else {
		m, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			h.give(size, true)
			return buf, fmt.Errorf("mapping a hook body buffer: %w", err)
		}
		grown, mapped = m[:len(buf)], m
	}
	copy(grown, buf)
	switch {
	case h.mapped != nil:
		unix.Munmap(h.mapped)
		h.give(int64(len(h.mapped)), true)
	case cap(buf) > 0:
		h.give(int64(cap(buf)), false)
	}
	h.mapped = mapped
	return grown, nil
}

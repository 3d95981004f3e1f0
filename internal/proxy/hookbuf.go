package proxy

import (
	"errors"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

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
}

// detailHookBuffer is the log detail of a hook call refused for the budget.
const detailHookBuffer = "hook_buffer"

var errHookBuffer = errors.New("limits.hook_buffer_bytes reached: too many hook bodies buffered at once")

// reserve takes n bytes of the budget, or reports false when they do not fit,
// collecting the garbage first when that would make them fit.
func (b *hookBudget) reserve(n int64) bool {
	if b.tryReserve(n) {
		return true
	}
	if b.used.Load()+n > b.limit.Load() || b.garbage.Load() == 0 {
		return false
	}
	b.collect()
	return b.tryReserve(n)
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

func (b *hookBudget) release(n int64) {
	b.used.Add(-n)
	b.garbage.Add(n)
}

// hookChunk is the first reservation for a body of unknown length; it doubles as
// the body grows.
const hookChunk = 32 << 10

// hookBuffer is one hook body read into reserved memory. Release returns the
// reservation once the bytes are no longer needed.
type hookBuffer struct {
	b        *hookBudget
	reserved int64
}

func (h *hookBuffer) release() {
	h.b.release(h.reserved)
	h.reserved = 0
}

// read reads r to its end, or to limit+1 bytes (the caller tells "too large" from
// the length), reserving every byte of capacity before allocating it. hint is the
// declared length, or -1.
func (h *hookBuffer) read(r io.Reader, limit, hint int64) ([]byte, error) {
	// A declared length is reserved and allocated at once: growing the buffer
	// would leave garbage, and garbage is memory the budget does not see. (A body
	// that declares a megabyte and stalls takes a megabyte of the budget; sending
	// it would cost the sandbox nothing more.)
	size := int64(hookChunk)
	if hint >= 0 {
		size = hint + 1 // +1: room to read the EOF, or one byte too many
	}
	buf, err := h.grow(nil, min(size, limit+1))
	for err == nil {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return buf, nil
			}
			if buf, err = h.grow(buf, min(2*int64(cap(buf)), limit+1)); err != nil {
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

// grow returns buf with capacity size, reserved first.
func (h *hookBuffer) grow(buf []byte, size int64) ([]byte, error) {
	more := size - int64(cap(buf))
	if !h.b.reserve(more) {
		return buf, &refusal{Reason: allowlist.ReasonOverloaded, Detail: detailHookBuffer, Err: errHookBuffer}
	}
	h.reserved += more
	grown := make([]byte, len(buf), size)
	copy(grown, buf)
	return grown, nil
}

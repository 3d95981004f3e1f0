package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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
//
// A buffer of mmapMin bytes or more is mapped from the kernel rather than taken
// from the Go heap, and unmapped on release: its memory leaves the process at
// once, and it never inflates the collector's heap goal (a heap holding a full
// budget of hook bodies may otherwise grow to twice that before it collects).
// Nothing may read it after release: the forwarded request body reads it through
// reader, which stops at release, and the decision is copied out.
type hookBuffer struct {
	b        *hookBudget
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
		h.b.used.Add(-int64(len(h.mapped))) // returned to the kernel: no garbage
		h.reserved -= int64(len(h.mapped))
		h.mapped = nil
	}
	h.b.release(h.reserved)
	h.reserved = 0
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
	if size < mmapMin {
		grown := make([]byte, len(buf), size)
		copy(grown, buf)
		return grown, nil
	}
	m, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return buf, fmt.Errorf("mapping a hook body buffer: %w", err)
	}
	grown := m[:len(buf)]
	copy(grown, buf)
	if h.mapped != nil {
		unix.Munmap(h.mapped)
		h.b.used.Add(-int64(len(h.mapped)))
		h.reserved -= int64(len(h.mapped))
	}
	h.mapped = m
	return grown, nil
}

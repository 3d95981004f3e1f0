package proxy

import (
	"errors"
	"io"
	"sync/atomic"

	"github.com/egressd/egressd/internal/allowlist"
)

// hookBudget bounds the bytes of every hook body egressd holds in memory at once,
// process-wide (limits.hook_buffer_bytes): requests, which egressd reads whole to
// sign them, and decisions, which it reads whole to check them. Each buffer is
// reserved before it is allocated and released when the call ends, so many large
// or stalled hook bodies, on any number of connections and HTTP/2 streams, cost at
// most the budget. Past it a call fails with overloaded: the fail-closed deny for
// a pre-tool call, 503 for anything else.
type hookBudget struct {
	limit atomic.Int64
	used  atomic.Int64
}

// detailHookBuffer is the log detail of a hook call refused for the budget.
const detailHookBuffer = "hook_buffer"

var errHookBuffer = errors.New("limits.hook_buffer_bytes reached: too many hook bodies buffered at once")

// reserve takes n bytes of the budget, or reports false when they do not fit.
func (b *hookBudget) reserve(n int64) bool {
	for {
		used := b.used.Load()
		if used+n > b.limit.Load() {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

func (b *hookBudget) release(n int64) { b.used.Add(-n) }

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
	// A declared length is believed only up to hookChunk: stalled bodies that
	// declare a megabyte and send nothing must not take the budget for nothing.
	size := int64(hookChunk)
	if hint >= 0 {
		size = min(hint+1, hookChunk) // +1: room to read the EOF, or one byte too many
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

package scrub

import (
	"bytes"
	"slices"
	"sync"
)

// Buffer sizes. A stream starts with a small buffer (most scrubbed
// responses are small) and doubles it, up to maxRead, while reads fill it.
const (
	minRead = 4 << 10
	maxRead = 32 << 10
)

// How a scan releases bytes.
type release int

const (
	// holdBack releases all but the longest suffix that could start a match.
	holdBack release = iota
	// flushAll releases everything but keeps that suffix as context, so an
	// occurrence that continues in the next bytes is still masked there (a
	// WebSocket frame's end inside a fragmented message).
	flushAll
	// final releases everything and keeps nothing (end of the body).
	final
)

// stream is the masking state machine behind Reader: a buffer whose first
// keep bytes are the suffix kept from the last scan (of which the first sent
// were already released, as context only) followed by new bytes. Memory is
// the buffer (at most maxRead plus the longest pattern) whatever the length
// of the input.
type stream struct {
	set  *Set
	buf  []byte
	pbuf *[]byte // buf's pool entry
	raw  []byte  // unmasked copy of the kept suffix (masking is in place)
	hm   []bool  // hm[i]: kept byte i belongs to an occurrence already found
	hm2  []bool  // scratch for the next hm
	keep int
	sent int
	end  int
	occ  []span // scratch for the occurrences of a scan
	full bool   // the last read filled the buffer: grow it
	n    int    // occurrences found so far
}

// space readies the buffer for new bytes and returns where to put them;
// the output of the last scan is invalid from here on.
func (st *stream) space() []byte {
	if st.buf == nil {
		st.getBuf(minRead + st.set.maxLen)
	}
	if st.full && len(st.buf) < maxRead+st.set.maxLen {
		putBuf(st.pbuf)
		st.getBuf(min(2*(len(st.buf)-st.set.maxLen), maxRead) + st.set.maxLen)
	}
	st.end = copy(st.buf, st.raw[:st.keep])
	return st.buf[st.end:]
}

// scan takes n new bytes (written into space()), masks every occurrence
// found, and returns the bytes it releases, masked. Occurrences are counted
// once: in the scan that sees their last byte.
func (st *stream) scan(n int, how release) []byte {
	st.full = n == len(st.buf)-st.end
	st.end += n
	win := st.buf[:st.end]
	st.occ = st.set.find(win, st.occ[:0]) // before any masking of win
	hold := 0
	if how != final {
		hold = st.set.hold(win)
	}
	emit, from := len(win)-hold, len(win)-hold
	if how != holdBack {
		emit = len(win)
	}
	emit = max(emit, st.sent) // the hold may start inside released context
	st.raw = append(st.raw[:0], win[from:]...)
	if hold > cap(st.hm2) {
		// Most bodies end outside any prefix: the marks are made on first need.
		marks := make([]bool, 2*st.set.maxLen)
		st.hm2 = marks[:0:st.set.maxLen]
		st.hm = append(marks[st.set.maxLen:st.set.maxLen], st.hm...)
	}
	next := st.hm2[:hold]
	clear(next)
	mark := func(i int) {
		if i >= st.sent && i < emit {
			win[i] = Mask
		}
		if i >= from {
			next[i-from] = true
		}
	}
	for i, m := range st.hm {
		if m {
			mark(i)
		}
	}
	for _, o := range st.occ {
		if o.end > st.keep {
			st.n++
		}
		for i := o.start; i < o.end; i++ {
			mark(i)
		}
	}
	if how == flushAll && hold >= MinLen {
		// MinLen bytes or more that begin a form of a secret: mask them now
		// rather than let them out unmasked before the rest arrives.
		for i := from; i < len(win); i++ {
			win[i] = Mask
		}
	}
	out := win[st.sent:emit]
	st.hm, st.hm2 = next, st.hm
	st.keep, st.sent = hold, max(emit, from)-from
	return out
}

// free returns the buffer to the pool: the stream is over and its last
// output consumed.
func (st *stream) free() {
	if st.buf != nil {
		putBuf(st.pbuf)
		st.buf, st.pbuf = nil, nil
	}
}

// bufPool recycles stream buffers: most scrubbed bodies are small, and a
// fresh 4 KiB buffer per response is most of a small body's cost. The pool
// holds the *[]byte each buffer came with, so putting one back allocates
// nothing.
var bufPool sync.Pool // of *[]byte

// getBuf sets buf to a buffer of at least n bytes (all of a pooled one's
// capacity, so a pooled large buffer is used whole).
func (st *stream) getBuf(n int) {
	p, ok := bufPool.Get().(*[]byte)
	if !ok || cap(*p) < n {
		b := make([]byte, n)
		p = &b
	}
	st.pbuf, st.buf = p, (*p)[:cap(*p)]
}

func putBuf(p *[]byte) { bufPool.Put(p) }

// drop forgets the kept bytes: on a source error (they are never
// released) and before a new WebSocket message (no context from the last).
func (st *stream) drop() {
	st.keep, st.sent = 0, 0
	st.hm = st.hm[:0]
}

// hold returns the length of the longest suffix of b that is a proper
// prefix of some pattern: the only bytes a later read can still complete
// into a match.
func (s *Set) hold(b []byte) int {
	n := 0
	for _, m := range s.parts {
		n = max(n, m.hold(b))
	}
	return n
}

// hold is Set.hold for m's patterns. It checks only the last maxLen-1 bytes,
// and a start there only when its first two bytes begin some pattern, so it
// costs little per read.
func (m *matcher) hold(b []byte) int {
	for i := max(0, len(b)-(m.maxLen-1)); i < len(b); i++ {
		if m.formStarts(b, i) || m.flexHead[b[i]] && (i+1 == len(b) || m.flexPair.has(b[i], b[i+1])) && m.flexStarts(b[i:]) {
			return len(b) - i
		}
	}
	return 0
}

// formStarts reports whether b[i:] is a proper prefix of a form.
func (m *matcher) formStarts(b []byte, i int) bool {
	if !m.first[b[i]] {
		return false
	}
	if i+1 < len(b) && !m.pair.has(b[i], b[i+1]) {
		return false
	}
	return m.properPrefix(b[i:])
}

// flexStarts reports whether b is a proper prefix of a flexible spelling.
func (m *matcher) flexStarts(b []byte) bool {
	for i := range m.flex {
		if m.flex[i].startsSpelling(b) {
			return true
		}
	}
	return false
}

// properPrefix reports whether b is a prefix of some longer pattern.
func (m *matcher) properPrefix(b []byte) bool {
	i, _ := slices.BinarySearchFunc(m.sorted, b, bytes.Compare)
	for ; i < len(m.sorted) && bytes.HasPrefix(m.sorted[i], b); i++ {
		if len(m.sorted[i]) > len(b) {
			return true
		}
	}
	return false
}

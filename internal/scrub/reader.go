package scrub

import (
	"bytes"
	"errors"
	"io"
	"slices"
)

// Read sizes. A Reader starts with a small buffer (most scrubbed responses
// are small) and doubles it, up to maxRead, while the source fills it.
const (
	minRead = 4 << 10
	maxRead = 32 << 10
)

// Reader is a streaming masker: it reads its source and returns the same
// bytes with every occurrence of the Set's patterns masked.
//
// It holds back only the bytes that could be the start of a match (the
// longest suffix of what it has read that is a proper prefix of a pattern),
// so a chunk that ends outside any possible match (an SSE event's "\n\n") is
// returned by the Read that received it, and memory stays bounded by the
// longest pattern plus one read, whatever the body size. At EOF the held bytes
// are released as they are (they matched nothing); on any other source error
// they are dropped (they may be most of a secret) and the error returned.
type Reader struct {
	set  *Set
	src  io.Reader
	buf  []byte // [off:emit) masked, ready; [emit:end) held back, unmasked
	hm   []bool // hm[i]: held byte emit+i belongs to an occurrence already found
	hm2  []bool // scratch for the next hm
	off  int
	emit int
	end  int
	n    int
	err  error
	next func() // fills buf; nil means fillRead
}

// Reader returns a Reader masking r. With an inactive Set it passes r's
// bytes through untouched.
func (s *Set) Reader(r io.Reader) *Reader { return &Reader{set: s, src: r} }

// Count returns the number of occurrences replaced so far.
func (r *Reader) Count() int { return r.n }

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if !r.set.Active() {
		return r.src.Read(p)
	}
	for {
		if r.off < r.emit {
			n := copy(p, r.buf[r.off:r.emit])
			r.off += n
			return n, nil
		}
		if r.err != nil {
			return 0, r.err
		}
		if len(p) == 0 {
			return 0, nil
		}
		if r.next != nil {
			r.next()
		} else {
			r.fillRead()
		}
	}
}

// fillRead reads once from the source after the held bytes and scans.
func (r *Reader) fillRead() {
	carry := r.compact()
	n, err := r.src.Read(r.buf[carry:])
	r.end += n
	if n == len(r.buf)-carry && len(r.buf) < maxRead+r.set.maxLen {
		r.grow()
	}
	r.finish(carry, err)
}

// finish scans after a fill and records the source's error: at EOF nothing
// is held; on another error the held bytes are dropped.
func (r *Reader) finish(carry int, err error) {
	eof := errors.Is(err, io.EOF)
	r.scan(carry, eof)
	if err != nil && !eof {
		r.end = r.emit // drop the held bytes: they may be most of a secret
		r.hm = r.hm[:0]
	}
	r.err = err
}

// compact moves the held bytes to the front and returns their count.
func (r *Reader) compact() int {
	if r.buf == nil {
		r.buf = make([]byte, minRead+r.set.maxLen)
		r.hm = make([]bool, 0, r.set.maxLen)
		r.hm2 = make([]bool, 0, r.set.maxLen)
	}
	carry := copy(r.buf, r.buf[r.emit:r.end])
	r.off, r.emit, r.end = 0, 0, carry
	return carry
}

// grow doubles the buffer (bounded by maxRead plus the longest pattern).
func (r *Reader) grow() {
	size := min(2*(len(r.buf)-r.set.maxLen), maxRead) + r.set.maxLen
	nb := make([]byte, size)
	copy(nb, r.buf[:r.end])
	r.buf = nb
}

// scan masks buf[:end], whose first carry bytes were held from the last
// scan, and decides how much to release: all of it when final, else all but
// the bytes that could start a match.
func (r *Reader) scan(carry int, final bool) {
	win := r.buf[:r.end]
	hold := 0
	if !final {
		hold = r.set.hold(win)
	}
	emit := len(win) - hold
	newHM := r.hm2[:hold]
	clear(newHM)
	matches := r.set.ac.FindAllOverlapping(win) // before any masking of win
	for i, m := range r.hm {
		r.markAt(win, i, emit, m, newHM)
	}
	for _, m := range matches {
		if m.End > carry {
			r.n++
		}
		for i := m.Start; i < m.End; i++ {
			r.markAt(win, i, emit, true, newHM)
		}
	}
	r.hm, r.hm2 = newHM, r.hm
	r.emit = emit
}

// markAt masks win[i] now when it is released, or remembers it when held.
func (r *Reader) markAt(win []byte, i, emit int, masked bool, held []bool) {
	if !masked {
		return
	}
	if i < emit {
		win[i] = Mask
	} else {
		held[i-emit] = true
	}
}

// hold returns the length of the longest suffix of b that is a proper
// prefix of some pattern: the only bytes a later read can still complete
// into a match. It checks only the last maxLen-1 bytes, and a start there only
// when its first two bytes begin some pattern, so it costs little per read.
func (s *Set) hold(b []byte) int {
	for i := max(0, len(b)-(s.maxLen-1)); i < len(b); i++ {
		if !s.first[b[i]] {
			continue
		}
		if i+1 < len(b) {
			k := int(b[i])<<8 | int(b[i+1])
			if s.pair[k/64]&(1<<(k%64)) == 0 {
				continue
			}
		}
		if s.properPrefix(b[i:]) {
			return len(b) - i
		}
	}
	return 0
}

// properPrefix reports whether b is a prefix of some longer pattern.
func (s *Set) properPrefix(b []byte) bool {
	i, _ := slices.BinarySearchFunc(s.sorted, b, bytes.Compare)
	for ; i < len(s.sorted) && bytes.HasPrefix(s.sorted[i], b); i++ {
		if len(s.sorted[i]) > len(b) {
			return true
		}
	}
	return false
}

package scrub

import (
	"encoding/binary"
	"math/bits"
)

// The prefilter keeps the DFA off the bytes that cannot hold an anchor. The
// DFA costs one dependent table load per byte (most of a Reader's CPU in a
// profile); the prefilter looks at one 4-byte gram every
// step bytes, where step is the shortest anchor's length less gramLen-1, and
// runs the DFA only around a gram that occurs in some anchor. Why this and
// not a byte skip (bytes.IndexByte to the next first byte, the library's own
// prefilter, which FindAllOverlapping does not use anyway): the hundred or so forms of
// three credentials start with dozens of distinct bytes, all common in text,
// so a first-byte skip barely skips; and the library alternatives for many
// literals (coregx/coregex's Teddy) stop at 32 of them.
//
// No false negative, by counting: an anchor occurrence b[s:s+m] has m >=
// minAnchor, so the grams wholly inside it start at the m-gramLen+1 >= step
// positions s..s+m-gramLen, one of which is a multiple of step and so is
// sampled; that gram is one of the anchor's, so its hash bit is set, and the
// region scanned around it, [j+gramLen-reach, j+reach), holds every anchor
// that contains it. A hash collision only costs a scan. FuzzReader holds the
// result to bytes.Index over every form.

// gramLen is the sampled gram's length: one unaligned 32-bit load.
const gramLen = 4

// The bitmap's size bounds, as log2 of its bits: 2 KiB to 128 KiB.
const (
	minBitmap = 14
	maxBitmap = 20
)

// minStep is the shortest sampling step worth a prefilter: below it the
// samples cost about what the DFA does.
const minStep = 2

// prefilter is a bitmap of the hashed grams of every anchor.
type prefilter struct {
	bits  []uint64
	shift uint // 32 - log2 of the bitmap's size in bits
	step  int  // sampling stride: the shortest anchor's length - gramLen + 1
	reach int  // the longest anchor's length
}

// newPrefilter returns the prefilter of anchors, or nil when an anchor is
// too short for one to pay (every byte then goes through the DFA).
func newPrefilter(anchors [][]byte) *prefilter {
	shortest, longest, grams := len(anchors[0]), 0, 0
	for _, a := range anchors {
		shortest, longest = min(shortest, len(a)), max(longest, len(a))
		grams += len(a) - gramLen + 1
	}
	p := &prefilter{step: shortest - gramLen + 1, reach: longest}
	if p.step < minStep {
		return nil
	}
	// 128 to 256 bits per gram: a gram of text not in any anchor hits with
	// probability under 1%, and a larger bitmap leaves fewer regions to scan
	// (BenchmarkMatcher).
	size := max(minBitmap, min(maxBitmap, bits.Len(uint(grams))+7))
	p.bits = make([]uint64, 1<<size/64)
	p.shift = uint(32 - size)
	for _, a := range anchors {
		for i := 0; i+gramLen <= len(a); i++ {
			h := p.hash(a[i:])
			p.bits[h/64] |= 1 << (h % 64)
		}
	}
	return p
}

// hash maps the gram at the start of b (at least gramLen bytes) to a bit.
func (p *prefilter) hash(b []byte) uint32 {
	return binary.LittleEndian.Uint32(b) * gramHash >> p.shift
}

// gramHash is the multiplier of a gram's (Fibonacci) hash: its top bits
// depend on every bit of the gram.
const gramHash = 0x9E3779B1

// regions calls scan for each region of b that may hold an anchor, in order;
// the regions are disjoint, so no occurrence is reported twice.
func (p *prefilter) regions(b []byte, scan func(lo, hi int)) {
	bitmap, shift, step, reach := p.bits, p.shift, p.step, p.reach // in registers, not reloaded after each scan
	lo, hi := 0, 0
	for j := 0; j+gramLen <= len(b); j += step {
		h := binary.LittleEndian.Uint32(b[j:j+gramLen]) * gramHash >> shift
		if bitmap[h/64]&(1<<(h%64)) == 0 {
			continue
		}
		from, to := max(0, j+gramLen-reach), min(len(b), j+reach)
		if from > hi {
			if hi > lo {
				scan(lo, hi)
			}
			lo = from
		}
		hi = to
	}
	if hi > lo {
		scan(lo, hi)
	}
}

package main

import (
	"math/bits"
	"time"
)

// histogram records latencies in log-linear buckets, HDR-style: exact below
// 128 ns, then 64 buckets per power of two, so any recorded value is within
// 1/64 (1.6%) of the bucket it is reported as. Fixed size, no allocation per
// record; one per client, merged at the end, so recording takes no lock.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    time.Duration
	max    time.Duration
}

const (
	subBits     = 6
	subBuckets  = 1 << subBits       // 64 buckets per power of two
	linearLimit = 2 * subBuckets     // values below this are their own bucket
	histBuckets = subBuckets * 59    // enough for every uint64
	bucketShift = subBits + 1        // bits.Len64 of the first non-linear value
	minMantissa = uint64(subBuckets) // mantissas run over [64, 128)
)

func bucketOf(v uint64) int {
	if v < linearLimit {
		return int(v)
	}
	shift := bits.Len64(v) - bucketShift
	m := v >> shift // in [64, 128)
	return subBuckets*(shift+1) + int(m-minMantissa)
}

// bucketValue is the middle of bucket i.
func bucketValue(i int) uint64 {
	if i < linearLimit {
		return uint64(i)
	}
	shift := i/subBuckets - 1
	m := uint64(i%subBuckets) + minMantissa
	return m<<shift + (uint64(1)<<shift)/2
}

func (h *histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	h.n++
	h.sum += d
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// quantile returns the latency below which a fraction q of the samples fall.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(bucketValue(i)), h.max)
		}
	}
	return h.max
}

func (h *histogram) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

package main

import (
	"slices"
	"time"
)

// histogram keeps every latency a client measured in its window: one per
// client, merged at the end, so recording takes no lock.
type histogram struct {
	samples []time.Duration
	sum     time.Duration
}

func (h *histogram) record(d time.Duration) {
	h.samples = append(h.samples, d)
	h.sum += d
}

func (h *histogram) merge(o *histogram) {
	h.samples = append(h.samples, o.samples...)
	h.sum += o.sum
}

func (h *histogram) n() int { return len(h.samples) }

// quantile returns the latency below which a fraction q of the samples fall.
func (h *histogram) quantile(q float64) time.Duration {
	if len(h.samples) == 0 {
		return 0
	}
	slices.Sort(h.samples)
	rank := min(max(int(q*float64(len(h.samples))+0.5), 1), len(h.samples))
	return h.samples[rank-1]
}

func (h *histogram) mean() time.Duration {
	if len(h.samples) == 0 {
		return 0
	}
	return h.sum / time.Duration(len(h.samples))
}

func (h *histogram) max() time.Duration {
	if len(h.samples) == 0 {
		return 0
	}
	return slices.Max(h.samples)
}

package main

import (
	"testing"
	"time"
)

// Every value lands in a bucket whose reported value is within 1/64 of it, and
// buckets grow with the value.
func TestBucketPrecision(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 63, 64, 127, 128, 129, 255, 256, 1000, 1e6, 123456789, 1 << 40, 1<<63 - 1, 1<<64 - 1} {
		i := bucketOf(v)
		if i < prev {
			t.Errorf("bucketOf(%d) = %d, below the previous value's %d", v, i, prev)
		}
		prev = i
		if i >= histBuckets {
			t.Fatalf("bucketOf(%d) = %d, beyond %d buckets", v, i, histBuckets)
		}
		got := bucketValue(i)
		diff := max(got, v) - min(got, v)
		if diff > v/64+1 {
			t.Errorf("bucketValue(bucketOf(%d)) = %d, off by %d", v, got, diff)
		}
	}
}

func TestQuantile(t *testing.T) {
	var a, b histogram
	for i := 1; i <= 50; i++ {
		a.record(time.Duration(i) * time.Millisecond)
		b.record(time.Duration(i+50) * time.Millisecond)
	}
	a.merge(&b)
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.50, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}} {
		got := a.quantile(tc.q)
		if d := got - tc.want; d < -tc.want/64 || d > tc.want/64 {
			t.Errorf("quantile(%v) = %v, want %v within 1/64", tc.q, got, tc.want)
		}
	}
	if a.n != 100 || a.max != 100*time.Millisecond {
		t.Errorf("n = %d, max = %v; want 100, 100ms", a.n, a.max)
	}
	var empty histogram
	if empty.quantile(0.5) != 0 || empty.mean() != 0 {
		t.Error("an empty histogram reports nonzero latencies")
	}
}

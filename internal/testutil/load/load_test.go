package load

import (
	"testing"
	"time"
)

func TestQuantiles(t *testing.T) {
	var a, b Latencies
	if a.Quantile(0.5) != 0 || a.Mean() != 0 {
		t.Fatalf("empty: quantile %v, mean %v; want 0", a.Quantile(0.5), a.Mean())
	}
	for i := 100; i >= 51; i-- {
		a.Record(time.Duration(i) * time.Millisecond)
	}
	for i := 1; i <= 50; i++ {
		b.Record(time.Duration(i) * time.Millisecond)
	}
	a.Merge(b)
	for q, want := range map[float64]time.Duration{0.01: 1, 0.5: 50, 0.99: 99, 1: 100} {
		if got := a.Quantile(q); got != want*time.Millisecond {
			t.Errorf("Quantile(%v) = %v, want %v", q, got, want*time.Millisecond)
		}
	}
	odd := Latencies{3, 1, 2}
	if got := odd.Quantile(0.5); got != 2 {
		t.Errorf("median of 1, 2, 3: %v, want 2", got)
	}
	if a.N() != 100 || a.Mean() != 50500*time.Microsecond {
		t.Errorf("N %d, mean %v; want 100, 50.5ms", a.N(), a.Mean())
	}
}

func TestErrorKind(t *testing.T) {
	a := ErrorKind("dial tcp 127.0.0.1:41234: connect: connection refused")
	b := ErrorKind("dial tcp 127.0.0.1:39999: connect: connection refused")
	if a != b || a != "dial tcp 127.x:port: connect: connection refused" {
		t.Errorf("ErrorKind: %q and %q, want both masked alike", a, b)
	}
	if s := "status 403"; ErrorKind(s) != s {
		t.Errorf("ErrorKind(%q) = %q, want it unchanged", s, ErrorKind(s))
	}
}

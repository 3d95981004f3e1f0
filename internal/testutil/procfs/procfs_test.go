package procfs

import (
	"os"
	"testing"
)

func TestSelf(t *testing.T) {
	pid := os.Getpid()
	if l, err := LoadAvg(); err != nil || l < 0 {
		t.Errorf("LoadAvg = %v, %v", l, err)
	}
	rss, err := RSS(pid)
	if err != nil || rss <= 0 {
		t.Fatalf("RSS = %d, %v", rss, err)
	}
	peak, err := PeakRSS(pid)
	if err != nil || peak < rss {
		t.Errorf("PeakRSS = %d, %v; want at least RSS %d", peak, err, rss)
	}
	if _, err := StatusBytes(pid, "NoSuchField"); err == nil {
		t.Error("StatusBytes of a missing field: no error")
	}
	f, _ := os.Open(os.Args[0])
	defer f.Close()
	n, err := FDs(pid)
	if err != nil || n < 1 {
		t.Errorf("FDs = %d, %v", n, err)
	}
	if lim, err := FDLimit(pid); err != nil || lim < uint64(n) {
		t.Errorf("FDLimit = %d, %v", lim, err)
	}
	if cpu, err := CPU(pid); err != nil || cpu < 0 || ClockTicks() <= 0 {
		t.Errorf("CPU = %v, %v (%d ticks/s)", cpu, err, ClockTicks())
	}
}

func TestParseFDLimit(t *testing.T) {
	limits := `Limit                     Soft Limit           Hard Limit           Units
Max processes             unlimited            unlimited            processes
Max open files            20000                65536                files
Max locked memory         8388608              8388608              bytes
`
	if n, err := parseFDLimit(limits); err != nil || n != 20000 {
		t.Errorf("parseFDLimit = %d, %v", n, err)
	}
	if _, err := parseFDLimit("Max processes 5 5 processes\n"); err == nil {
		t.Error("parseFDLimit without the line succeeded")
	}
}

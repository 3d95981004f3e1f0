package procfs

import (
	"os"
	"testing"
)

func TestSelf(t *testing.T) {
	pid := os.Getpid()
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
	if n, err := FDs(pid); err != nil || n < 1 {
		t.Errorf("FDs = %d, %v", n, err)
	}
}

package conformance_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/load"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

// The TLS flood: distinct names under *.flood.test (an injecting entry, so every
// tunnel is intercepted and each name costs egressd a leaf mint), bounded in count
// and time.
const (
	floodNames   = 3000
	floodWorkers = 8
	floodFor     = 20 * time.Second
	// rssBound is how far above idle egressd's RSS may go under an attack: an
	// attack that grows it further is on its way to an OOM kill.
	rssBound = 64 << 20
)

// floodAllowlist is the strict allowlist with the flood's entry.
var floodAllowlist = append(slices.Clone(strictAllowlist),
	egressdtest.Entry{Domain: "*.flood.test", Transform: map[string]string{"X-Flood": "1"}})

// TestHookUnderTLSFlood: while a flood of new TLS names runs (each a leaf mint,
// together far more than limits.leaf_mints can mint at once), a pre-tool hook call
// gets the endpoint's allow within its timeout, its leaf is a cache hit every time
// (the hook host's leaf was minted at start and is pinned), and RSS stays within
// 64 MiB of idle. After the flood, ordinary requests are served.
func TestHookUnderTLSFlood(t *testing.T) {
	w := hooksWorld(t, config{allowlist: floodAllowlist})
	for i := range floodNames {
		w.DNS.Set(floodName(i), "A "+publicIP)
	}
	k := w.begin(t)
	idle := w.rss(t)
	hits0 := w.leafLookups(t, "hit")

	var minted atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var next atomic.Int64
	deadline := time.Now().Add(floodFor)
	for range floodWorkers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < floodNames && time.Now().Before(deadline); i = int(next.Add(1)) - 1 {
				select {
				case <-stop:
					return
				default:
				}
				if w.handshake(floodName(i)) == nil {
					minted.Add(1)
				}
			}
		})
	}
	var lat load.Latencies
	peak := idle
	for len(lat) < 20 || (minted.Load() < floodNames/2 && time.Now().Before(deadline)) {
		lat.Record(k.hookCallAllowed())
		peak = max(peak, w.rss(t))
		time.Sleep(100 * time.Millisecond)
		if len(lat) >= 200 {
			break
		}
	}
	flooded := minted.Load()
	close(stop)
	wg.Wait()
	peak = max(peak, w.rss(t))

	if hits := w.leafLookups(t, "hit") - hits0; hits != len(lat) {
		t.Errorf("leaf cache hits %d during the flood, want one per hook call (%d): the hook host's leaf was not always cached", hits, len(lat))
	}
	if misses := w.leafLookups(t, "miss"); misses < int(flooded) {
		t.Errorf("leaf cache misses %d, fewer than the flood's %d new names: the flood did not mint", misses, flooded)
	}
	if peak-idle > rssBound {
		t.Errorf("RSS %d MiB at peak, %d MiB idle: more than %d MiB above idle", peak>>20, idle>>20, rssBound>>20)
	}
	t.Logf("TLS flood: %d names handshaken while %d hook calls ran; hook latency p50 %s p99 %s max %s; RSS idle %d MiB, peak %d MiB, after %d MiB",
		flooded, len(lat), lat.Quantile(0.5), lat.Quantile(0.99), lat.Quantile(1), idle>>20, peak>>20, w.rss(t)>>20)
	if flooded < 200 {
		t.Errorf("only %d flood handshakes completed: not a flood", flooded)
	}
	if resp := k.get("http://allowed.test/after-flood"); resp.StatusCode != http.StatusOK {
		t.Errorf("after the flood: %d", resp.StatusCode)
	}
}

func floodName(i int) string { return fmt.Sprintf("n%d.flood.test", i) }

// hookCallAllowed makes one pre-tool hook call to the endpoint that allows, on a new
// intercepted tunnel (so its leaf is looked up), and returns how long it took; the
// answer must be the allow, within the hook's timeout.
func (k *kase) hookCallAllowed() time.Duration {
	k.t.Helper()
	start := time.Now()
	c := k.intercepted("policy.allowed.test")
	defer c.Close()
	k.send(c, "POST "+hookAllowPath+" HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 2\r\n\r\n{}")
	resp := k.response(c, http.MethodPost)
	b := k.body(resp)
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"allow"`) {
		k.t.Fatalf("hook call during the flood: %d %s, want the endpoint's allow", resp.StatusCode, b)
	}
	if took > hookTimeout {
		k.t.Errorf("hook call took %s during the flood, past its timeout %s", took, hookTimeout)
	}
	return took
}

// handshake opens an intercepted tunnel to host:443 and completes TLS with egressd's
// leaf for host; it is the flood's unit of work (a leaf mint).
func (w *world) handshake(host string) error {
	nc, err := net.DialTimeout("tcp", w.ProxyAddr, 2*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(ioTimeout))
	fmt.Fprintf(nc, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", host, host)
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("CONNECT %s: %d", host, resp.StatusCode)
	}
	return tls.Client(nc, &tls.Config{ServerName: host, RootCAs: w.roots}).Handshake()
}

// rss is egressd's resident set now.
func (w *world) rss(t *testing.T) int64 {
	t.Helper()
	n, err := procfs.RSS(w.ServingPid())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// leafLookups reads egressd_leaf_cache_total{result} from the admin listener.
func (w *world) leafLookups(t *testing.T, result string) int {
	t.Helper()
	code, body, err := w.adminGet("/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	prefix := `egressd_leaf_cache_total{result="` + result + `"} `
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return int(n)
		}
	}
	return 0
}

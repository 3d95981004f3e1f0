package mitm

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingLeaves is a Leaves with a small cache that counts its lookups.
func countingLeaves(t *testing.T, o LeafOptions) (*Leaves, *atomic.Int64, *atomic.Int64) {
	var hits, misses atomic.Int64
	o.OnLookup = func(hit bool) {
		if hit {
			hits.Add(1)
		} else {
			misses.Add(1)
		}
	}
	return NewLeaves(testCA(t, caValidity), o), &hits, &misses
}

// TestPinnedLeafNeverEvicted: Pin mints the hook hosts' leaves at once (uncounted),
// and no number of other names evicts them: every later Get is a hit.
func TestPinnedLeafNeverEvicted(t *testing.T) {
	l, hits, misses := countingLeaves(t, LeafOptions{CacheSize: 4})
	if err := l.Pin([]string{"policy.example", "audit.example"}); err != nil {
		t.Fatal(err)
	}
	if l.mints.Load() != 2 || hits.Load()+misses.Load() != 0 {
		t.Fatalf("Pin minted %d (want 2) and counted %d lookups (want 0)", l.mints.Load(), hits.Load()+misses.Load())
	}
	pinned, _ := l.Get("policy.example")
	for i := range 100 {
		if _, err := l.Get(fmt.Sprintf("flood-%d.example", i)); err != nil {
			t.Fatal(err)
		}
	}
	h0 := hits.Load()
	if got, _ := l.Get("policy.example"); got != pinned || hits.Load() != h0+1 {
		t.Fatal("the pinned leaf was evicted by other names")
	}
	if l.lru.Len() != 4 {
		t.Errorf("the LRU holds %d, want its size 4 (pinned leaves are apart from it)", l.lru.Len())
	}
}

// TestPinnedMintSkipsQueue: with every mint slot held by a flood, a pinned host
// whose leaf must be (re-)minted is served at once; another new name waits.
func TestPinnedMintSkipsQueue(t *testing.T) {
	clock := &fakeClock{}
	clock.set(time.Now().Truncate(time.Second))
	l := NewLeaves(testCA(t, caValidity), LeafOptions{MintConcurrency: 1, Validity: 8 * time.Second})
	l.now = clock.now
	if err := l.Pin([]string{"policy.example"}); err != nil {
		t.Fatal(err)
	}
	first, _ := l.Get("policy.example")
	clock.advance(7 * time.Second) // inside the refresh window: the next Get re-mints
	l.sem <- struct{}{}            // the flood holds the only slot
	defer func() { <-l.sem }()
	done := make(chan error, 2)
	go func() {
		c, err := l.Get("policy.example")
		if err == nil && c == first {
			err = fmt.Errorf("the stale pinned leaf was served")
		}
		done <- err
	}()
	finishes(t, done, "a pinned host's mint waited for a mint slot")
	go func() { _, err := l.Get("other.example"); done <- err }()
	select {
	case <-done:
		t.Fatal("an unpinned name minted without a free slot")
	case <-time.After(50 * time.Millisecond):
	}
	<-l.sem
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	l.sem <- struct{}{} // for the deferred release
}

// TestRePinMovesHosts: a reload's Pin pins new hosts (taking their cached leaf if
// there is one) and returns the hosts it no longer names to the LRU.
func TestRePinMovesHosts(t *testing.T) {
	l, _, _ := countingLeaves(t, LeafOptions{CacheSize: 2})
	cached, _ := l.Get("new.example")
	if err := l.Pin([]string{"old.example"}); err != nil {
		t.Fatal(err)
	}
	old, _ := l.Get("old.example")
	mints := l.mints.Load()
	if err := l.Pin([]string{"new.example"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.Get("new.example"); got != cached || l.mints.Load() != mints {
		t.Error("pinning a cached host did not keep its leaf")
	}
	if got, _ := l.Get("old.example"); got != old {
		t.Error("an unpinned host lost its leaf")
	}
	for i := range 3 {
		l.Get(fmt.Sprintf("flood-%d.example", i))
	}
	if _, ok := l.byHost["old.example"]; ok {
		t.Error("an unpinned host's leaf was not evicted like any other")
	}
	if l.ServerConfig("new.example", nil).GetCertificate == nil {
		t.Fatal("no GetCertificate")
	}
}

// TestPinnedUnderConcurrentFlood: goroutines minting distinct names while a hook
// host is looked up; every hook lookup is a hit (run under -race).
func TestPinnedUnderConcurrentFlood(t *testing.T) {
	l, hits, misses := countingLeaves(t, LeafOptions{CacheSize: 8, MintConcurrency: 2})
	if err := l.Pin([]string{"policy.example"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				l.Get(fmt.Sprintf("f%d-%d.example", g, i))
			}
		})
	}
	for range 50 {
		if _, err := l.ServerConfig("policy.example", nil).GetCertificate(nil); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if misses.Load() != 200 || hits.Load() != 50 {
		t.Errorf("%d misses (want the flood's 200) and %d hits (want the hook's 50)", misses.Load(), hits.Load())
	}
}

// TestPinsPerOwner: in node mode each sandbox pins its own hook hosts; one
// sandbox's pins (a new spec with no hooks, its removal) never unpin another's.
func TestPinsPerOwner(t *testing.T) {
	l, _, _ := countingLeaves(t, LeafOptions{CacheSize: 1})
	if err := l.PinFor("sbx-a", []string{"a-policy.example"}); err != nil {
		t.Fatal(err)
	}
	if err := l.PinFor("sbx-b", []string{"b-policy.example"}); err != nil {
		t.Fatal(err)
	}
	if err := l.PinFor("sbx-b", nil); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		l.Get(fmt.Sprintf("flood-%d.example", i))
	}
	if _, ok := l.pinned["a-policy.example"]; !ok {
		t.Fatal("another sandbox's pins undid sbx-a's")
	}
	if _, ok := l.pinned["b-policy.example"]; ok {
		t.Error("sbx-b's host is still pinned after it unpinned")
	}
	l.PinFor("sbx-a", nil)
	if _, ok := l.byHost["a-policy.example"]; !ok || len(l.pinned) != 0 {
		t.Error("a host no owner pins did not rejoin the LRU")
	}
}

// TestMintsBounded: a client with MintsPerClient mints running waits for one of
// them before it mints more, while another client takes the free slot: one
// client's flood of new names cannot hold every mint slot. Outside node mode a
// client is an address; in node mode a sandbox, whatever source address its
// connections use (its code may pick any of its loopback addresses).
func TestMintsBounded(t *testing.T) {
	addr := func(ip string) *net.TCPAddr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000} }
	for _, c := range []struct {
		name                   string
		holder                 mintKey // the flooder's one mint, running
		flooder, other         string  // sandboxes
		flooderAddr, otherAddr *net.TCPAddr
	}{
		{"per address", mintKey{ip: netip.MustParseAddr("10.0.0.7")}, "", "", addr("10.0.0.7"), addr("10.0.0.8")},
		{"per sandbox", mintKey{sandbox: "sbx-a"}, "sbx-a", "sbx-b", addr("127.0.0.9"), addr("127.0.0.9")},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := NewLeaves(testCA(t, caValidity), LeafOptions{MintConcurrency: 2})
			if l.perClient != 1 {
				t.Fatalf("MintsPerClient default %d, want half of 2", l.perClient)
			}
			release := l.acquireClient(c.holder)
			l.sem <- struct{}{} // and the slot it holds
			flood := make(chan error, 1)
			go func() {
				_, err := l.ServerConfigFor(c.flooder, c.flooderAddr, "n2.flood.example", nil).GetCertificate(nil)
				flood <- err
			}()
			done := make(chan error, 1)
			go func() {
				_, err := l.ServerConfigFor(c.other, c.otherAddr, "other.example", nil).GetCertificate(nil)
				done <- err
			}()
			finishes(t, done, "another client's mint waited behind the flooder's")
			select {
			case <-flood:
				t.Fatal("the flooder minted past its bound")
			case <-time.After(50 * time.Millisecond):
			}
			<-l.sem
			release()
			if err := <-flood; err != nil {
				t.Fatal(err)
			}
			if len(l.byClient) != 0 {
				t.Errorf("%d clients left in the table after their mints", len(l.byClient))
			}
		})
	}
}

// finishes waits for done's result, failing with why when it takes 5 s.
func finishes(t *testing.T, done <-chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}

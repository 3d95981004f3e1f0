package placeholder

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/egressd/egressd/internal/credential"
)

// liveCreds is a credential store whose values a test changes meanwhile.
type liveCreds struct {
	mu   sync.Mutex
	vals map[string]string
}

func (c *liveCreds) Get(id string) (credential.Value, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.vals[id]
	if !ok {
		return credential.Value{}, &credential.UnavailableError{ID: id, Cause: credential.CauseNotFound}
	}
	return credential.Value{ID: id, Env: &credential.EnvVar{Value: v, Locations: []string{credential.LocationHeader},
		TrustedDomains: []string{"api.test"}}}, nil
}

func (c *liveCreds) set(id, v string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.vals[id] = v
}

func newLive(vals map[string]string) (*Replacer, *liveCreds) {
	c := &liveCreds{vals: vals}
	vars := map[string]string{}
	for id := range vals {
		vars[strings.ToUpper(id)] = id
	}
	return New([]byte("scrub-key-scrub-key-scrub-key-32"), "env", vars, nil, c), c
}

// masks reports whether the Replacer's Set masks v.
func masks(r *Replacer, v string) bool {
	_, n := r.Scrub().String("stored: " + v)
	return n > 0
}

// TestScrubEveryValue: the Set masks the value of every credential, with no
// request having carried a placeholder, and is compiled once, not per call.
func TestScrubEveryValue(t *testing.T) {
	r, _ := newLive(map[string]string{"a": "value-of-a-123456", "b": "value-of-b-abcdef"})
	if !masks(r, "value-of-a-123456") || !masks(r, "value-of-b-abcdef") || masks(r, "value-of-c-000000") {
		t.Fatal("the Set does not mask exactly the credentials' values")
	}
	if first := r.Scrub(); r.Scrub() != first {
		t.Error("the Set is compiled anew per call")
	}
	var none *Replacer
	if none.Scrub().Active() {
		t.Error("a nil Replacer scrubs")
	}
}

// TestScrubPlacedAtOnce: a value that changed in the store since the last
// sweep is in the Set as soon as Apply places it, before the request is
// forwarded; the previous value stays masked.
func TestScrubPlacedAtOnce(t *testing.T) {
	r, c := newLive(map[string]string{"a": "first-value-123456"})
	if !masks(r, "first-value-123456") {
		t.Fatal("not masked")
	}
	c.set("a", "rotated-value-abcdef")
	req := &http.Request{Header: http.Header{"X-Key": {r.Env()["A"]}}, URL: &url.URL{}, Body: http.NoBody}
	if res, err := r.Apply(req, "api.test", nil, false); err != nil || req.Header.Get("X-Key") != "rotated-value-abcdef" {
		t.Fatalf("apply: %v %v", res, err)
	}
	if !masks(r, "rotated-value-abcdef") || !masks(r, "first-value-123456") {
		t.Error("the placed value, or the one before it, is not masked")
	}
}

// TestScrubSweep: a value the store changed, that no request placed, is in
// the Set once sweepEvery has passed.
func TestScrubSweep(t *testing.T) {
	r, c := newLive(map[string]string{"a": "first-value-123456"})
	r.Scrub()
	c.set("a", "swept-value-abcdef")
	if masks(r, "swept-value-abcdef") {
		t.Fatal("swept before sweepEvery")
	}
	old := *r.values.Load()
	old.swept = old.swept.Add(-sweepEvery)
	r.values.Store(&old)
	if !masks(r, "swept-value-abcdef") {
		t.Error("a changed value is not swept in")
	}
}

// TestScrubKeepsValues: keepValues values of a credential stay masked across
// rotations; older ones are dropped, so the Set stays bounded.
func TestScrubKeepsValues(t *testing.T) {
	r, c := newLive(map[string]string{"a": "value-0-rotated-xx"})
	r.Scrub()
	for i := 1; i <= keepValues+1; i++ {
		// The store rotates too: a sweep (every sweepEvery, which a loaded machine
		// can reach within this test) then finds the newest value, not value 0.
		c.set("a", fmt.Sprintf("value-%d-rotated-xx", i))
		r.note("a", fmt.Sprintf("value-%d-rotated-xx", i))
	}
	for i := 0; i <= keepValues+1; i++ {
		if want := i > 1; masks(r, fmt.Sprintf("value-%d-rotated-xx", i)) != want {
			t.Errorf("value %d masked: %v, want %v", i, !want, want)
		}
	}
}

// TestScrubConcurrent: Scrub and Apply from many goroutines while values
// change (for -race); every placed value is masked once Apply returns.
func TestScrubConcurrent(t *testing.T) {
	r, c := newLive(map[string]string{"a": "start-value-000000"})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20 {
				if g == 0 {
					c.set("a", fmt.Sprintf("value-%02d-concurrent", i))
				}
				req := &http.Request{Header: http.Header{"X-Key": {r.Env()["A"]}}, URL: &url.URL{}, Body: http.NoBody}
				if _, err := r.Apply(req, "api.test", nil, false); err != nil {
					t.Error(err)
					return
				}
				if !masks(r, req.Header.Get("X-Key")) {
					t.Errorf("placed value %q not masked", req.Header.Get("X-Key"))
				}
			}
		})
	}
	wg.Wait()
}

package scrub

import (
	"fmt"
	"sync"
	"testing"
)

func TestCacheReusesAndEvicts(t *testing.T) {
	c := NewCache(2)
	a := c.Set(testValues[0], testValues[1])
	if c.Set(testValues[1], testValues[0]) != a {
		t.Error("the same values in another order compiled again")
	}
	if out, n := a.String(testValues[1]); n != 1 || out == testValues[1] {
		t.Errorf("cached Set does not mask: %q", out)
	}
	b := c.Set(testValues[2])
	c.Set(testValues[1], testValues[0]) // a is now the most recent
	c.Set(testValues[0])                // evicts the least recently used: b
	if c.Len() != 2 || c.Set(testValues[0], testValues[1]) != a || c.Set(testValues[2]) == b {
		t.Error("eviction is not least recently used")
	}
	if c.Set("ab", "c") == c.Set("a", "bc") {
		t.Error("values that concatenate alike share a key")
	}
}

func TestCacheConcurrent(t *testing.T) {
	c := NewCache(4)
	var wg sync.WaitGroup
	sets := make([]*Set, 16)
	for i := range sets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sets[i] = c.Set(fmt.Sprintf("credential-%d", i%8), testValues[0])
			if _, n := sets[i].String(testValues[0]); n != 1 {
				t.Errorf("goroutine %d: not masked", i)
			}
		}()
	}
	wg.Wait()
	if c.Len() != 4 {
		t.Errorf("Len = %d, want 4", c.Len())
	}
}

package syncbuf

import (
	"fmt"
	"sync"
	"testing"
)

func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { fmt.Fprintf(&b, "line %d\n", i) })
	}
	wg.Wait()
	if n := len(b.Lines()); n != 8 {
		t.Fatalf("%d lines, want 8: %q", n, b.String())
	}
	if b.Len() != len(b.Bytes()) {
		t.Errorf("Len %d, Bytes %d", b.Len(), len(b.Bytes()))
	}
	b.Reset()
	if b.Len() != 0 {
		t.Errorf("Len after Reset = %d", b.Len())
	}
}

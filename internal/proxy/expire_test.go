package proxy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestExpireOnNeverOutlivesStop: once the function expireOn returned has run, the
// deadline setter is never called again, even when the context ended at the same
// moment. An HTTP/2 hook call's setter is its stream's, which net/http releases
// when the handler returns: a late call there crashed egressd under -race. Half
// the rounds end the context before stop, so expire surely runs in some; the
// other half race the two.
func TestExpireOnNeverOutlivesStop(t *testing.T) {
	var late, fired atomic.Int64
	for i := range 2000 {
		var stopped atomic.Bool
		d := &bodyDeadline{set: func(time.Time) error {
			if stopped.Load() {
				late.Add(1)
			}
			fired.Add(1)
			return nil
		}}
		ctx, cancel := context.WithCancel(context.Background())
		stop := d.expireOn(ctx)
		if i%2 == 0 {
			go cancel() // races stop
		} else {
			cancel() // expire is already on its way when stop runs: stop must wait for it
		}
		stop()
		stopped.Store(true)
		cancel()
	}
	time.Sleep(50 * time.Millisecond) // a stray expire would run by now
	if late.Load() != 0 {
		t.Fatalf("the setter ran %d times after stop returned", late.Load())
	}
	if fired.Load() == 0 {
		t.Fatal("expire never ran: the test did not race the context's end against stop")
	}
}

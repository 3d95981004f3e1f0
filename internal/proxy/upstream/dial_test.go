package upstream

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/netguard"
)

// TestDialGuardedDialsOnlyTheDecidedTarget: the transports' dialer connects to the
// target the request's context carries, and fails closed (the canary listener sees
// no connection) when the context carries none or one the address was not written
// from.
func TestDialGuardedDialsOnlyTheDecidedTarget(t *testing.T) {
	canary, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer canary.Close()
	accepted := make(chan struct{}, 8)
	go func() {
		for {
			c, err := canary.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()
	guard, err := netguard.New(netguard.Options{UnsafeAllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	c := New(Options{Guard: guard, Limits: config.Default().Limits})
	ap := netip.MustParseAddrPort(canary.Addr().String())
	decided := allowlist.Target{Host: ap.Addr().String(), Addr: ap.Addr(), Port: ap.Port()}
	other := allowlist.Target{Host: "127.0.0.2", Addr: netip.MustParseAddr("127.0.0.2"), Port: ap.Port()}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want error // nil: dialled
	}{
		{"no target in the context", context.Background(), ErrNoTarget},
		{"another target in the context", WithTarget(context.Background(), other), errors.New("mismatch")},
		{"the decided target", WithTarget(context.Background(), decided), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := c.dialGuarded(tc.ctx, "tcp", decided.String())
			if tc.want == nil {
				if err != nil {
					t.Fatalf("dial of the decided target: %v", err)
				}
				nc.Close()
				waitAccepted(t, accepted, true)
				return
			}
			if err == nil {
				nc.Close()
				t.Fatal("dialled without the decided target in the context")
			}
			if errors.Is(tc.want, ErrNoTarget) && !errors.Is(err, ErrNoTarget) {
				t.Fatalf("error %v, want ErrNoTarget", err)
			}
			waitAccepted(t, accepted, false)
		})
	}
}

// waitAccepted checks whether the canary accepted a connection.
func waitAccepted(t *testing.T, accepted chan struct{}, want bool) {
	t.Helper()
	select {
	case <-accepted:
		if !want {
			t.Fatal("the canary got a connection")
		}
	case <-time.After(200 * time.Millisecond):
		if want {
			t.Fatal("the canary got no connection")
		}
	}
}

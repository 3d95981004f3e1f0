package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestClientCancelledIsNotAnUpstreamFailure: a client that gives up while the
// upstream is still answering (an HTTP/2 RST_STREAM) is logged and counted as
// client_cancelled, never as upstream_unreachable, which the shipped alerts watch:
// the sandbox cannot fake an upstream outage.
func TestClientCancelledIsNotAnUpstreamFailure(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	cc := w.h2ClientConn(t, "api.allowed.test:443")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://api.allowed.test/slow", nil)
	go func() {
		<-arrived
		cancel()
	}()
	if _, err := cc.RoundTrip(req); err == nil {
		t.Fatal("the cancelled request got a response")
	}
	l := w.waitLog(t, func(m map[string]any) bool { return m["path"] == "/slow" })
	if l["reason"] != "client_cancelled" || l["decision"] != "error" || l["status"] != float64(0) {
		t.Errorf("logged %v/%v status %v, want error/client_cancelled and no status", l["decision"], l["reason"], l["status"])
	}
	for reason, want := range map[string]float64{"upstream_unreachable": 0, "client_cancelled": 1} {
		got := testutil.ToFloat64(w.Metrics.Requests.WithLabelValues("sandbox", "error", reason))
		if got != want {
			t.Errorf("egressd_requests_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}

package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

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

// TestHTTP1ClientGoneNeverForwarded: an HTTP/1.1 client that closes its connection
// while egressd is still resolving the target (here a DNS answer that takes 1.5 s)
// gets nothing dialled or forwarded for it, and the request is logged as
// client_cancelled, not as a response served.
func TestHTTP1ClientGoneNeverForwarded(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	w.DNS.SetFunc("slow.allowed.test", func(int) []string {
		time.Sleep(1500 * time.Millisecond)
		return []string{"A " + w.PublicIP}
	})
	before := w.Upstream.requests.Load()
	for _, plain := range []bool{true, false} {
		var c net.Conn
		if plain {
			c, _ = w.dialProxy(t)
			io.WriteString(c, "GET http://slow.allowed.test/gone HTTP/1.1\r\nHost: slow.allowed.test\r\n\r\n")
		} else {
			c, _ = w.interceptedH1(t, "api.allowed.test")
			w.DNS.SetFunc("api.allowed.test", func(int) []string {
				time.Sleep(1500 * time.Millisecond)
				return []string{"A " + w.PublicIP}
			})
			io.WriteString(c, "GET /gone HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n")
		}
		time.Sleep(300 * time.Millisecond)
		c.Close()
		l := w.waitLog(t, func(m map[string]any) bool { return m["path"] == "/gone" })
		if l["reason"] != "client_cancelled" {
			t.Errorf("plain=%v: logged %v/%v status %v, want client_cancelled", plain, l["decision"], l["reason"], l["status"])
		}
		w.logs.Reset()
	}
	time.Sleep(time.Second)
	if n := w.Upstream.requests.Load() - before; n != 0 {
		t.Errorf("the upstream got %d requests from clients that had gone", n)
	}
}

// TestTunnelClosedBeforeHelloIsCancelled: a client that closes a CONNECT tunnel
// before sending a byte gave up; it did not send a malformed ClientHello.
func TestTunnelClosedBeforeHelloIsCancelled(t *testing.T) {
	w := newWorld(t, worldOpts{})
	c := w.connect(t, "www.allowed.test:443")
	c.Close()
	l := w.waitLog(t, func(m map[string]any) bool { return m["method"] == "CONNECT" })
	if l["reason"] != "client_cancelled" {
		t.Errorf("logged %v/%v, want client_cancelled", l["reason"], l["detail"])
	}
}

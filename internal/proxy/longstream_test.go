package proxy_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/egressd/egressd/internal/config"
)

// quietLimits makes read_header short, so a stream that outlives it shows that only
// limits.stream_idle governs a forwarded stream.
func quietLimits(streamIdle time.Duration) func(*config.Limits) {
	return func(l *config.Limits) {
		l.ReadHeader = time.Second
		l.StreamIdle = streamIdle
	}
}

// TestQuietStreamLives: once a request is forwarded, a body that goes quiet for
// longer than limits.read_header (a bidirectional gRPC stream between messages) is
// not cut; each read may wait limits.stream_idle. HTTP/2 and HTTP/1.1 (chunked).
func TestQuietStreamLives(t *testing.T) {
	w := newInjectWorld(t, worldOpts{limits: quietLimits(time.Minute)})
	for _, h2 := range []bool{true, false} {
		name := map[bool]string{true: "HTTP/2", false: "HTTP/1.1"}[h2]
		t.Run(name, func(t *testing.T) {
			c := w.interceptingClient()
			c.Transport.(*http.Transport).ForceAttemptHTTP2 = h2
			pr, pw := io.Pipe()
			go func() {
				io.WriteString(pw, "first,")
				time.Sleep(2500 * time.Millisecond) // quiet for 2.5 read_headers
				io.WriteString(pw, "second")
				pw.Close()
			}()
			req, _ := http.NewRequest("POST", "https://api.allowed.test/stream", pr)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if got := decodeEcho(t, resp); got.Body != "first,second" || (got.Proto == "HTTP/2.0") != h2 {
				t.Errorf("upstream got %q over %s", got.Body, got.Proto)
			}
		})
	}
}

// TestQuietWebSocketLivesUntilStreamIdle: an upgraded connection quiet for longer
// than read_header lives; one with no bytes either way for limits.stream_idle is
// closed.
func TestQuietWebSocketLivesUntilStreamIdle(t *testing.T) {
	w := newInjectWorld(t, worldOpts{limits: quietLimits(3 * time.Second)})
	w.Upstream.set(wsEchoAll)
	ws := w.websocket(t, nil)
	defer ws.Close()
	wsRoundTrip(t, ws, "before")
	time.Sleep(2 * time.Second) // quiet, past read_header, within stream_idle
	wsRoundTrip(t, ws, "after")
	start := time.Now()
	var msg string
	ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := websocket.Message.Receive(ws, &msg); err == nil {
		t.Fatalf("read %q from an idle WebSocket", msg)
	}
	if took := time.Since(start); took < 2*time.Second || took > 6*time.Second {
		t.Errorf("the idle WebSocket was closed after %v, want about stream_idle (3 s)", took)
	}
}

// TestStreamedEventNotHeldBack: an SSE event whose last bytes could begin the
// injected secret reaches the client once the upstream pauses (20 ms), not at the
// upstream's next write; what is released is never the secret.
func TestStreamedEventNotHeldBack(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	release := make(chan struct{})
	defer close(release)
	event := "data: " + secretToken[:3]
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(rw, event)
		rw.(http.Flusher).Flush()
		<-release
	})
	for _, h2 := range []bool{false, true} {
		c := w.interceptingClient()
		c.Transport.(*http.Transport).ForceAttemptHTTP2 = h2
		resp, err := c.Get("https://api.allowed.test/events")
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(event))
		done := make(chan error, 1)
		start := time.Now()
		go func() { _, err := io.ReadFull(resp.Body, got); done <- err }()
		select {
		case err := <-done:
			if err != nil || string(got) != event {
				t.Errorf("h2=%v: read %q %v", h2, got, err)
			}
			t.Logf("h2=%v: the event arrived %v after the response head", h2, time.Since(start))
		case <-time.After(3 * time.Second):
			t.Errorf("h2=%v: the event's held bytes were not released", h2)
		}
		resp.Body.Close()
	}
}

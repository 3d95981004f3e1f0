//go:build walk

package proxy_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestWalk sends the four requests scripts/walk.sh follows through the code under
// delve: an explicit GET, a GET through an intercepted CONNECT, a spliced
// transparent TLS connection and one HTTP/2 stream in an intercepted tunnel. Each
// walk lies between walkBegin and walkEnd, and ends once egressd has written the
// canonical lines it owes (a tunnel's at its close), so the trace holds the whole
// request and nothing of the fixture's setup.
func TestWalk(t *testing.T) {
	w, sb := newTransparentWorld(t)

	walk(t, w, "get", 1, func() {
		resp, err := patient(w.client()).Get("http://www.allowed.test/walk")
		drain(t, resp, err)
	})

	walk(t, w, "connect-intercept", 2, func() { // the inner request's line, then the tunnel's
		c := patient(w.interceptingClient())
		resp, err := c.Get("https://api.allowed.test/walk")
		drain(t, resp, err)
		c.CloseIdleConnections()
	})

	walk(t, w, "transparent-splice", 1, func() {
		c, err := sb.dial(t, "tcp", w.PublicIP+":443")
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{ServerName: "www.allowed.test", RootCAs: w.UpstreamCA, NextProtos: []string{"http/1.1"}})
		drain(t, get(t, tc, "www.allowed.test", "/walk"), nil)
		tc.Close()
	})

	cc := w.h2ClientConn(t, "api.allowed.test:443") // the tunnel is open before the walk
	walk(t, w, "h2-stream", 1, func() {
		req, _ := http.NewRequest("GET", "https://api.allowed.test/walk", nil)
		resp, err := cc.RoundTrip(req)
		drain(t, resp, err)
	})
}

// walk runs one walk and waits for the n canonical lines it makes.
func walk(t *testing.T, w *world, name string, n int, do func()) {
	before := len(w.logLines())
	walkBegin(name)
	do()
	for deadline := time.Now().Add(30 * time.Second); len(w.logLines()) < before+n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d log lines", name, len(w.logLines())-before, n)
		}
	}
	walkEnd(name)
}

// patient lifts the client's timeout: under delve every traced call stops the process.
func patient(c *http.Client) *http.Client {
	c.Timeout = 0
	return c
}

func drain(t *testing.T, resp *http.Response, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// walkBegin and walkEnd mark a walk in delve's trace; they must stay calls.
//
//go:noinline
func walkBegin(name string) { _ = name }

//go:noinline
func walkEnd(name string) { _ = name }

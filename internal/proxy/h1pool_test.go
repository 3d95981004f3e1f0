package proxy_test

import (
	"bufio"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
)

// rawUpstream is an HTTP/1.1 upstream on a public IP of the test's namespace that
// counts its connections and serves each with serve.
type rawUpstream struct {
	url     string
	accepts atomic.Int64
}

func startRawUpstream(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) *rawUpstream {
	t.Helper()
	return startRawUpstreamOn(t, nextPublicIP(), serve)
}

// startRawUpstreamOn is startRawUpstream on port 80 of ip.
func startRawUpstreamOn(t *testing.T, ip string, serve func(c net.Conn, br *bufio.Reader)) *rawUpstream {
	t.Helper()
	ln := listenOn(t, ip+":80")
	t.Cleanup(func() { ln.Close() })
	u := &rawUpstream{url: "http://" + ip + "/"}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.accepts.Add(1)
			go func() {
				defer c.Close()
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	return u
}

// answerEach answers every request on the connection with resp, then returns
// (closing the connection) after limit requests, or never when limit is 0.
func answerEach(resp string, limit int) func(net.Conn, *bufio.Reader) {
	return func(c net.Conn, br *bufio.Reader) {
		for n := 1; ; n++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			out := resp
			if req.Method == http.MethodHead {
				out = resp[:strings.Index(resp, "\r\n\r\n")+4]
			}
			if _, err := io.WriteString(c, out); err != nil || n == limit {
				return
			}
		}
	}
}

func poolWorld(t *testing.T) *world {
	return newWorld(t, worldOpts{allowlist: append([]allowlist.Entry{{Domain: "*"}}, defaultEntries...)})
}

func getOK(t *testing.T, c *http.Client, method, url string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %q %s", method, url, resp.StatusCode, resp.Header.Get("Egressd-Reason"), body)
	}
}

const okResponse = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// TestUpstreamPoolReusesConnections: GETs and HEADs from one keep-alive client go
// over one upstream connection.
func TestUpstreamPoolReusesConnections(t *testing.T) {
	w := poolWorld(t)
	up := startRawUpstream(t, answerEach(okResponse, 0))
	c := w.client()
	for range 3 {
		getOK(t, c, http.MethodGet, up.url)
	}
	getOK(t, c, http.MethodHead, up.url)
	getOK(t, c, http.MethodGet, up.url)
	if n := up.accepts.Load(); n != 1 {
		t.Errorf("upstream accepted %d connections for 5 sequential requests, want 1", n)
	}
}

// TestUpstreamPoolIdleTimeout: a pooled connection idle past limits.upstream_idle
// is not reused.
func TestUpstreamPoolIdleTimeout(t *testing.T) {
	w := newWorld(t, worldOpts{
		allowlist: append([]allowlist.Entry{{Domain: "*"}}, defaultEntries...),
		limits:    func(l *config.Limits) { l.UpstreamIdle = 100 * time.Millisecond },
	})
	up := startRawUpstream(t, answerEach(okResponse, 0))
	c := w.client()
	getOK(t, c, http.MethodGet, up.url)
	getOK(t, c, http.MethodGet, up.url)
	time.Sleep(250 * time.Millisecond)
	getOK(t, c, http.MethodGet, up.url)
	if n := up.accepts.Load(); n != 2 {
		t.Errorf("upstream accepted %d connections, want 2 (one reused at once, one after upstream_idle)", n)
	}
}

// TestUpstreamPoolReplacesClosedConnection: an upstream that closed its idle
// connection costs the client nothing: the request is sent again on a new one.
func TestUpstreamPoolReplacesClosedConnection(t *testing.T) {
	w := poolWorld(t)
	up := startRawUpstream(t, answerEach(okResponse, 1)) // closes after each response
	c := w.client()
	for i := range 3 {
		getOK(t, c, http.MethodGet, up.url)
		time.Sleep(50 * time.Millisecond) // let egressd's pooled connection see nothing yet
		if i == 0 && up.accepts.Load() != 1 {
			t.Fatalf("accepts after the first request: %d", up.accepts.Load())
		}
	}
	if n := up.accepts.Load(); n != 3 {
		t.Errorf("upstream accepted %d connections, want 3 (each closed after one response)", n)
	}
}

// TestUpstreamPoolHonoursClose: a response with Connection: close, and one whose
// body the client abandoned, are never followed by another request on their
// connection.
func TestUpstreamPoolHonoursClose(t *testing.T) {
	t.Run("Connection: close", func(t *testing.T) {
		w := poolWorld(t)
		up := startRawUpstream(t, answerEach("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 0))
		c := w.client()
		getOK(t, c, http.MethodGet, up.url)
		getOK(t, c, http.MethodGet, up.url)
		if n := up.accepts.Load(); n != 2 {
			t.Errorf("upstream accepted %d connections, want 2", n)
		}
	})
	t.Run("body abandoned", func(t *testing.T) {
		w := poolWorld(t)
		big := strings.Repeat("x", 4<<20)
		var requests atomic.Int64
		up := startRawUpstream(t, func(c net.Conn, br *bufio.Reader) {
			for {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				if requests.Add(1) == 1 {
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\n\r\n"+big)
				} else {
					io.WriteString(c, okResponse)
				}
			}
		})
		nc, err := net.Dial("tcp", w.ProxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(nc, "GET "+up.url+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, err := http.ReadResponse(bufio.NewReader(nc), nil); err != nil {
			t.Fatal(err)
		}
		nc.Close() // before the body
		time.Sleep(100 * time.Millisecond)
		getOK(t, w.client(), http.MethodGet, up.url)
		if n := up.accepts.Load(); n != 2 {
			t.Errorf("upstream accepted %d connections, want 2: the abandoned one must not be reused", n)
		}
	})
}

// TestUpstreamPoolShutdownEndsStalledBody: a response body that stalls does not
// hold egressd past its shutdown deadline: the upstream connection is closed.
func TestUpstreamPoolShutdownEndsStalledBody(t *testing.T) {
	w := poolWorld(t)
	closed := make(chan struct{})
	up := startRawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isNetTimeout(err) {
			close(closed)
		}
	})
	nc, err := net.Dial("tcp", w.ProxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	io.WriteString(nc, "GET "+up.url+" HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := http.ReadResponse(bufio.NewReader(nc), nil); err != nil {
		t.Fatal(err)
	}
	w.Server.Shutdown(contextWithTimeout(t, 200*time.Millisecond))
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Fatal("upstream connection with a stalled body still open after shutdown")
	}
}

func isNetTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestUpstreamPoolRefusesSplittingHeader: a credential whose value has line breaks
// (a PEM key an entry names by mistake) must not split the request head on the
// pool's path, as net/http's Transport refuses it on the other: the request is
// refused and the upstream sees no connection.
func TestUpstreamPoolRefusesSplittingHeader(t *testing.T) {
	ip := nextPublicIP()
	pemKey := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("not a real key")}))
	secret, _ := json.Marshal(map[string]string{"token": pemKey})
	w := newWorld(t, worldOpts{
		allowlist:   append([]allowlist.Entry{{Domain: ip, Credential: "pem", AllowPlaintext: true}}, defaultEntries...),
		credentials: map[string]string{"pem": string(secret)},
	})
	up := startRawUpstreamOn(t, ip, answerEach(okResponse, 0))
	resp := w.raw("GET " + up.url + " HTTP/1.1\r\nHost: " + ip + "\r\n\r\n")
	assertRefused(t, resp, http.StatusBadGateway, "upstream_unreachable", "")
	if n := up.accepts.Load(); n != 0 {
		t.Errorf("upstream accepted %d connections, want 0", n)
	}
}

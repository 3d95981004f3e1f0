// Package echo is the upstream of egressd's end-to-end tests: an HTTP and HTTPS
// (HTTP/1.1 and HTTP/2) server that answers every request with what it received, as
// JSON, so a test asserts exactly the headers egressd sent; it records the requests
// and counts connections.
//
// A suite adds its own routes (a policy endpoint, a redirect, a slow answer) with
// Route, and masks planted values with Redact, so that a value in what the client
// reads can only have come from egressd.
package echo

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// maxBody bounds the request body the echo reads.
const maxBody = 1 << 20

// Request is what the echo received, as it answers it.
type Request struct {
	Method, Host, Path, Proto string
	URI                       string // the request target as received, query included
	TLS                       bool
	At                        time.Time // when the echo read it
	Header, Trailer           http.Header
	Body                      string
	BodyErr                   string `json:",omitempty"` // reading the body failed
	Note                      string `json:",omitempty"` // set by Server.Inspect
}

// Server is the echo. Set its fields before the first Serve.
type Server struct {
	// Route sees each request first; when it returns true it has answered, and
	// the echo neither records nor answers the request.
	Route func(w http.ResponseWriter, r *http.Request) bool
	// Redact rewrites each header and trailer value and the body before they are
	// recorded and answered; nil keeps them.
	Redact func(string) string
	// Inspect sees each request with what the echo made of it, before it is
	// recorded and answered; it may set Note.
	Inspect func(r *http.Request, got *Request)
	// Forget records nothing (for long runs); the counters still count.
	Forget bool
	// HTTP1Only makes HTTPS offer http/1.1 alone, as httptest's TLS server does,
	// so that egressd's upstream side speaks HTTP/1.1.
	HTTP1Only bool
	// ErrorLog is the servers' error log; nil discards (a tunnel closed before its
	// ClientHello is a normal event in these tests).
	ErrorLog *log.Logger

	conns, requests atomic.Int64
	mu              sync.Mutex
	seen            []Request
	servers         []*http.Server
}

// ServeHTTP answers r with what it received.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	if s.Route != nil && s.Route(w, r) {
		return
	}
	got := s.Read(r)
	if s.Inspect != nil {
		s.Inspect(r, &got)
	}
	s.Record(got)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(got)
}

// Read reads r's body and returns what the echo makes of r, redacted.
func (s *Server) Read(r *http.Request) Request {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	got := Request{Method: r.Method, Host: r.Host, Path: r.URL.Path, Proto: r.Proto, URI: s.redact(r.RequestURI),
		TLS: r.TLS != nil, At: time.Now(),
		Header: s.redactHeader(r.Header), Trailer: s.redactHeader(r.Trailer), Body: s.redact(string(body))}
	if err != nil {
		got.BodyErr = err.Error()
	}
	return got
}

func (s *Server) redact(v string) string {
	if s.Redact == nil {
		return v
	}
	return s.Redact(v)
}

func (s *Server) redactHeader(h http.Header) http.Header {
	if h == nil {
		return nil
	}
	out := make(http.Header, len(h))
	for k, vs := range h {
		for _, v := range vs {
			out[k] = append(out[k], s.redact(v))
		}
	}
	return out
}

// Record adds got to the requests received (a Route's own requests, too).
func (s *Server) Record(got Request) {
	if s.Forget {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, got)
}

// Count is how many requests are recorded.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// Since returns the requests recorded after the first n.
func (s *Server) Since(n int) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > len(s.seen) {
		return nil
	}
	return append([]Request(nil), s.seen[n:]...)
}

// Requests returns every request recorded.
func (s *Server) Requests() []Request { return s.Since(0) }

// Conns is how many connections the echo accepted; Served how many requests it
// saw (routed ones included).
func (s *Server) Conns() int64  { return s.conns.Load() }
func (s *Server) Served() int64 { return s.requests.Load() }

// Serve serves ln in the background: plain HTTP when cert is nil, else HTTPS
// with HTTP/2 and HTTP/1.1 by ALPN (HTTP/1.1 alone with HTTP1Only).
func (s *Server) Serve(ln net.Listener, cert *tls.Certificate) {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: s.ErrorLog, ConnState: s.countConn}
	if srv.ErrorLog == nil {
		srv.ErrorLog = log.New(io.Discard, "", 0)
	}
	s.mu.Lock()
	s.servers = append(s.servers, srv)
	s.mu.Unlock()
	if cert == nil {
		go srv.Serve(ln)
		return
	}
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: []string{"h2", "http/1.1"}}
	if s.HTTP1Only {
		srv.TLSConfig.NextProtos = []string{"http/1.1"}
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){} // no h2
	}
	go srv.ServeTLS(ln, "", "")
}

// Listen listens on addr (such as 127.0.0.1:0), serves it as Serve does and
// returns the bound port.
func (s *Server) Listen(addr string, cert *tls.Certificate) (int, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return 0, err
	}
	s.Serve(ln, cert)
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) countConn(_ net.Conn, st http.ConnState) {
	if st == http.StateNew {
		s.conns.Add(1)
	}
}

// Close stops every server at once, closing their connections.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, srv := range s.servers {
		srv.Close()
	}
}

// Decode reads an echo's answer.
func Decode(body []byte) (Request, error) {
	var got Request
	err := json.Unmarshal(body, &got)
	return got, err
}

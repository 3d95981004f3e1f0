package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egressd/egressd/internal/testutil/load"
)

// Bounds that keep a run bounded even if the clock or the far side
// misbehaves; errorBackoff keeps a refused connection from being a busy loop.
const (
	maxRequestsPerClient = 10_000_000
	requestTimeout       = 10 * time.Second // a request's head, and a run's overrun
	errorBackoff         = 5 * time.Millisecond
)

// cpuFunc reads a process's CPU time so far; a run samples it at its window's edges.
type cpuFunc = func() (time.Duration, error)

// loadOptions are the settings every run of a report shares.
type loadOptions struct {
	clients, size    int
	warmup, duration time.Duration
}

// runResult is one run: one target, all clients, one measured window.
type runResult struct {
	Requests   int64            `json:"requests"` // completed inside the window
	Seconds    float64          `json:"seconds"`
	ReqPerSec  float64          `json:"req_per_s"`
	P50US      float64          `json:"p50_us"`
	P99US      float64          `json:"p99_us"`
	MeanUS     float64          `json:"mean_us"`
	MaxUS      float64          `json:"max_us"`
	Total      int64            `json:"total_requests"` // warm-up and overrun included
	Errors     int64            `json:"errors"`         // warm-up included
	ErrorKinds map[string]int64 `json:"error_kinds,omitempty"`
	// The clients' dials and the far side's accepts: with keep-alive both
	// equal the client count. Then the far side's requests, and those
	// carrying each injected value (tally).
	ClientConns      int64            `json:"client_conns"`
	UpstreamConns    int64            `json:"upstream_conns"`
	UpstreamRequests int64            `json:"upstream_requests"`
	Injected         map[string]int64 `json:"upstream_injected,omitempty"` // by injection
	TLSHandshakes    int64            `json:"tls_handshakes"`
	TLSResumed       int64            `json:"tls_resumed"`
	CPUSeconds       float64          `json:"egressd_cpu_s,omitempty"` // the proxy's, over the window
	CPUError         string           `json:"egressd_cpu_error,omitempty"`

	hist load.Latencies // kept to merge rounds
}

// target is one side of a path: what every request asks for and how the
// client reaches it.
type target struct {
	url   string
	proxy string // "" for direct: absolute-form for http://, CONNECT for https://
	// dialAddr is where a direct run dials whatever the name resolves to, so
	// /etc/hosts cannot change what is measured.
	dialAddr                          string
	roots                             *x509.CertPool
	newConnPerRequest, resumeSessions bool
	allowDial                         func(addr string) error // nil: loopbackOnly
	// dialFrom makes the connection (from the sandbox namespace); nil dials here.
	dialFrom func(ctx context.Context, network, addr string) (net.Conn, error)
	method   string                     // "" is GET
	body     []byte                     // sent with every request
	header   http.Header                // sent with every request
	check    func(*http.Response) error // reads a 200's body; nil: exactly -size bytes
}

// runLoad drives t with lo.clients clients for the warm-up and then the
// window, sampling cpu (when set) at the window's edges.
func runLoad(ctx context.Context, t target, lo loadOptions, cpu cpuFunc) (runResult, error) {
	if t.check == nil {
		t.check = expectSize(lo.size)
	}
	start := time.Now()
	from, to := start.Add(lo.warmup), start.Add(lo.warmup+lo.duration)
	runCtx, cancel := context.WithDeadline(ctx, to.Add(requestTimeout))
	defer cancel()
	var dials atomic.Int64
	clients := make([]*client, lo.clients)
	for i := range clients {
		var err error
		if clients[i], err = newClient(runCtx, t, &dials); err != nil {
			return runResult{}, err
		}
	}
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() { c.loop(runCtx, from, to) })
	}
	var cpuUsed time.Duration
	var cpuErr error
	if cpu != nil {
		wg.Go(func() { cpuUsed, cpuErr = sampleCPU(runCtx, cpu, from, to) })
	}
	wg.Wait()
	for _, c := range clients {
		c.tr.CloseIdleConnections() // ends tunnels, so the proxy logs them now
	}
	if err := ctx.Err(); err != nil {
		return runResult{}, fmt.Errorf("interrupted: %w", err)
	}
	r := runResult{ClientConns: dials.Load(), CPUSeconds: cpuUsed.Seconds()}
	for _, c := range clients {
		c.r.TLSHandshakes, c.r.TLSResumed = c.handshakes.Load(), c.resumed.Load()
		r.merge(c.r)
	}
	if cpuErr != nil {
		r.CPUError = cpuErr.Error()
	}
	r.window(lo.duration.Seconds())
	return r, nil
}

// runCounted is runLoad with the upstream's counts of the run filled in.
func runCounted(ctx context.Context, t target, lo loadOptions, up *upstream, cpu cpuFunc) (runResult, error) {
	before := up.counts()
	r, err := runLoad(ctx, t, lo, cpu)
	r.fill(up.counts().sub(before))
	return r, err
}

// sampleCPU returns how much cpu() grew by between from and to.
func sampleCPU(ctx context.Context, cpu cpuFunc, from, to time.Time) (time.Duration, error) {
	before, err := time.Duration(0), sleepUntil(ctx, from)
	if err == nil {
		before, err = cpu()
	}
	if err == nil {
		err = sleepUntil(ctx, to)
	}
	if err != nil {
		return 0, err
	}
	after, err := cpu()
	return after - before, err
}

func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// merge adds x's counts, latencies and CPU time to r.
func (r *runResult) merge(x runResult) {
	r.Requests += x.Requests
	r.Seconds += x.Seconds
	r.Total += x.Total
	r.Errors += x.Errors
	addCounts(&r.ErrorKinds, x.ErrorKinds)
	r.ClientConns += x.ClientConns
	r.UpstreamConns += x.UpstreamConns
	r.UpstreamRequests += x.UpstreamRequests
	addCounts(&r.Injected, x.Injected)
	r.TLSHandshakes += x.TLSHandshakes
	r.TLSResumed += x.TLSResumed
	r.CPUSeconds += x.CPUSeconds
	r.CPUError = cmp.Or(x.CPUError, r.CPUError)
	r.hist.Merge(x.hist)
}

// window sets the figures of a window of seconds from the latencies.
func (r *runResult) window(seconds float64) {
	r.Seconds, r.Requests = seconds, int64(r.hist.N())
	r.ReqPerSec = float64(r.hist.N()) / seconds
	r.setLatencies()
}

func (r *runResult) setLatencies() {
	r.P50US, r.P99US = micros(r.hist.Quantile(0.50)), micros(r.hist.Quantile(0.99))
	r.MeanUS, r.MaxUS = micros(r.hist.Mean()), micros(r.hist.Quantile(1))
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// client is one load-generating connection: its own transport, so its own
// keep-alive connection. Only its goroutine touches it until the run is over.
type client struct {
	tr                  *http.Transport
	t                   target
	req                 *http.Request
	r                   runResult    // its requests, errors and latencies
	handshakes, resumed atomic.Int64 // added to by the transport's dialling goroutine
}

func newClient(ctx context.Context, t target, dials *atomic.Int64) (*client, error) {
	tr, err := newTransport(t, dials)
	if err != nil {
		return nil, err
	}
	c := &client{tr: tr, t: t}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{TLSHandshakeDone: c.countHandshake})
	var body io.Reader
	if t.body != nil {
		body = bytes.NewReader(t.body) // and GetBody, which roundTrip uses
	}
	if c.req, err = http.NewRequestWithContext(ctx, t.method, t.url, body); err != nil {
		return nil, err
	}
	maps.Copy(c.req.Header, t.header)
	if t.body != nil {
		c.req.Header.Set("Content-Type", "application/json")
	}
	return c, nil
}

func (c *client) countHandshake(cs tls.ConnectionState, err error) {
	if err == nil {
		c.handshakes.Add(1)
		if cs.DidResume {
			c.resumed.Add(1)
		}
	}
}

// roundTrip makes one request and has t.check read the whole body. A bodiless
// request is reused (net/http allows it once the last body is closed), which
// keeps the client's allocations out of the measurement; one with a body is a
// fresh copy, so the transport never sees a reader it may still hold.
func (c *client) roundTrip() error {
	req, t := c.req, c.t
	if req.GetBody != nil {
		req = c.req.WithContext(c.req.Context())
		req.Body, _ = c.req.GetBody() // a new reader of t.body
	}
	resp, err := c.tr.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		if reason := resp.Header.Get("Egressd-Reason"); reason != "" {
			return fmt.Errorf("status %d (Egressd-Reason: %s)", resp.StatusCode, reason)
		}
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return t.check(resp)
}

// loop issues requests until the window closes (or maxRequestsPerClient),
// recording the latency of those that complete inside [from, to].
func (c *client) loop(ctx context.Context, from, to time.Time) {
	for range maxRequestsPerClient {
		t0 := time.Now()
		if !t0.Before(to) || ctx.Err() != nil {
			return
		}
		err := c.roundTrip()
		t1 := time.Now()
		c.r.Total++
		if err != nil {
			c.r.Errors++
			addCount(&c.r.ErrorKinds, load.ErrorKind(err.Error()), 1)
			time.Sleep(errorBackoff)
			continue
		}
		if t1.After(from) && !t1.After(to) {
			c.r.hist.Record(t1.Sub(t0))
		}
	}
}

// newTransport builds a client's transport: HTTP/1.1 only (so every path
// speaks what a CONNECT splices), no compression, no environment proxy, one
// idle connection (its own keep-alive one).
func newTransport(t target, dials *atomic.Int64) (*http.Transport, error) {
	d := &net.Dialer{Timeout: requestTimeout}
	allow, dial := t.allowDial, t.dialFrom
	if allow == nil {
		allow = loopbackOnly
	}
	if dial == nil {
		dial = d.DialContext
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if t.dialAddr != "" && t.proxy == "" {
				addr = t.dialAddr
			}
			if err := allow(addr); err != nil {
				return nil, err
			}
			dials.Add(1)
			return dial(ctx, network, addr)
		},
		MaxIdleConns: 1, MaxIdleConnsPerHost: 1,
		DisableKeepAlives:     t.newConnPerRequest,
		DisableCompression:    true,
		TLSHandshakeTimeout:   requestTimeout,
		ResponseHeaderTimeout: requestTimeout,
		TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{}, // keeps HTTP/2 off
	}
	if t.roots != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: t.roots, MinVersion: tls.VersionTLS12}
		if t.resumeSessions {
			tr.TLSClientConfig.ClientSessionCache = tls.NewLRUClientSessionCache(1) // one host per client
		}
	}
	if t.proxy != "" {
		u, err := url.Parse(t.proxy)
		if err != nil {
			return nil, err
		}
		tr.Proxy = http.ProxyURL(u)
	}
	return tr, nil
}

// loopbackOnly refuses to dial anything but a loopback IP literal: the bench
// dials only its upstream and the proxies, all on 127.0.0.1, never a name.
func loopbackOnly(addr string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return errors.New("bench dials only loopback IP literals, not " + addr)
	}
	return nil
}

// expectSize is a check: the body is exactly n bytes.
func expectSize(n int) func(*http.Response) error {
	return func(resp *http.Response) error {
		got, err := io.Copy(io.Discard, resp.Body)
		switch {
		case err != nil:
			return fmt.Errorf("reading body: %w", err)
		case got != int64(n):
			return fmt.Errorf("body of %d bytes, want %d", got, n)
		}
		return nil
	}
}

// expectBody is a check: the body is exactly want, and no header in refuse is set.
func expectBody(want []byte, refuse ...string) func(*http.Response) error {
	return func(resp *http.Response) error {
		got, err := io.ReadAll(io.LimitReader(resp.Body, int64(len(want))+1))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
		}
		if err != nil {
			return fmt.Errorf("reading body: %w", err)
		}
		for _, h := range refuse {
			if v := resp.Header.Get(h); v != "" {
				return fmt.Errorf("response carries %s: %s", h, v)
			}
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("body %q, want %q", truncate(string(got), 80), want)
		}
		return nil
	}
}

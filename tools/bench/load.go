package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds on the load generator. A run ends at the end of its window; these
// keep it bounded even if the clock or the far side misbehaves.
const (
	// maxRequestsPerClient caps each client's loop by count as well as time.
	maxRequestsPerClient = 10_000_000
	// requestTimeout bounds one request (connect, TLS, response head; the
	// run's context bounds the body), and how long a run may overrun its window.
	requestTimeout = 10 * time.Second
	// errorBackoff spaces a client's requests after a failure, so a refused
	// connection does not become a busy loop.
	errorBackoff = 5 * time.Millisecond
)

// loadOptions are the settings every run of a report shares.
type loadOptions struct {
	clients  int
	size     int
	warmup   time.Duration
	duration time.Duration
}

// runResult is one run: one target, all clients, one measured window.
type runResult struct {
	Requests   int64            `json:"requests"` // completed inside the measured window
	Seconds    float64          `json:"seconds"`
	ReqPerSec  float64          `json:"req_per_s"`
	P50US      float64          `json:"p50_us"`
	P99US      float64          `json:"p99_us"`
	MeanUS     float64          `json:"mean_us"`
	MaxUS      float64          `json:"max_us"`
	Total      int64            `json:"total_requests"` // warm-up and overrun included
	Errors     int64            `json:"errors"`         // warm-up included
	ErrorKinds map[string]int64 `json:"error_kinds,omitempty"`
	// ClientConns counts the client's dials (to the upstream, or to egressd);
	// UpstreamConns the connections the upstream accepted (from the client,
	// or from egressd). With keep-alive both should equal the client count.
	ClientConns   int64 `json:"client_conns"`
	UpstreamConns int64 `json:"upstream_conns"`
	// UpstreamRequests is how many requests the upstream answered in the run
	// (warm-up included); Transformed and Credentialed how many of them
	// carried the transform's header or the credential's Authorization,
	// exactly once and with the exact value.
	UpstreamRequests int64 `json:"upstream_requests"`
	Transformed      int64 `json:"upstream_transformed"`
	Credentialed     int64 `json:"upstream_credentialed"`
	// VaultCredentialed counts those that carried the vault path's token.
	VaultCredentialed int64 `json:"upstream_vault_credentialed"`
	// OAuthCredentialed counts those that carried the oauth2 path's access token.
	OAuthCredentialed int64 `json:"upstream_oauth_credentialed"`
	// TLSHandshakes counts the clients' completed TLS handshakes (warm-up
	// included); TLSResumed those of them that resumed a session.
	TLSHandshakes int64 `json:"tls_handshakes"`
	TLSResumed    int64 `json:"tls_resumed"`
	// CPUSeconds is egressd's CPU time (user+system) over the window; only
	// for runs through egressd.
	CPUSeconds float64 `json:"egressd_cpu_s,omitempty"`
	// CPUError says why CPUSeconds could not be measured (egressd exited).
	CPUError string `json:"egressd_cpu_error,omitempty"`

	// hist is the window's latencies, kept to merge rounds.
	hist histogram
}

// runLoad drives t with lo.clients clients for the warm-up and then the measured
// window, and returns what the window saw. cpu, when set, is sampled at the
// window's edges.
func runLoad(ctx context.Context, t target, lo loadOptions, up *upstream, cpu func() (time.Duration, error)) (runResult, error) {
	before := up.counts()
	r, err := runCustomLoad(ctx, customTarget{target: t, method: http.MethodGet, check: expectSize(lo.size)}, lo, cpu)
	if err != nil {
		return r, err
	}
	r.fillUpstream(up.counts().sub(before))
	return r, nil
}

// fillUpstream sets the run's upstream figures from the counts it grew by.
func (r *runResult) fillUpstream(d upstreamCounts) {
	r.UpstreamConns, r.UpstreamRequests = d.accepted, d.served
	r.Transformed, r.Credentialed, r.VaultCredentialed, r.OAuthCredentialed = d.transform, d.credential, d.vaultCred, d.oauthCred
}

// runClients is the run of every load: lo.clients clients made by newC, each looping until the window closes, the CPU sampled at the window's
// edges when cpu is set, and the window's figures summed.
func runClients(ctx context.Context, lo loadOptions, cpu func() (time.Duration, error),
	newC func(context.Context, *atomic.Int64) (*client, error)) (runResult, error) {
	start := time.Now()
	from, to := start.Add(lo.warmup), start.Add(lo.warmup+lo.duration)
	runCtx, cancel := context.WithDeadline(ctx, to.Add(requestTimeout))
	defer cancel()

	var dials atomic.Int64
	clients := make([]*client, lo.clients)
	for i := range clients {
		c, err := newC(runCtx, &dials)
		if err != nil {
			return runResult{}, err
		}
		clients[i] = c
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
		c.tr.CloseIdleConnections() // ends tunnels, so egressd logs them now
	}
	if err := ctx.Err(); err != nil {
		return runResult{}, fmt.Errorf("interrupted: %w", err)
	}
	r := summarise(clients, lo.duration)
	r.ClientConns = dials.Load()
	r.CPUSeconds = cpuUsed.Seconds()
	if cpuErr != nil {
		r.CPUError = cpuErr.Error()
	}
	return r, nil
}

// sampleCPU returns how much CPU cpu() grew by between from and to.
func sampleCPU(ctx context.Context, cpu func() (time.Duration, error), from, to time.Time) (time.Duration, error) {
	if err := sleepUntil(ctx, from); err != nil {
		return 0, err
	}
	before, err := cpu()
	if err != nil {
		return 0, err
	}
	if err := sleepUntil(ctx, to); err != nil {
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

func summarise(clients []*client, window time.Duration) runResult {
	r := runResult{Seconds: window.Seconds()}
	for _, c := range clients {
		r.hist.merge(&c.hist)
		r.Total += c.total
		r.Errors += c.errors
		addCounts(&r.ErrorKinds, c.errorKinds)
		r.TLSHandshakes += c.handshakes.Load()
		r.TLSResumed += c.resumed.Load()
	}
	r.Requests = int64(r.hist.n)
	r.ReqPerSec = float64(r.hist.n) / window.Seconds()
	r.setLatencies()
	return r
}

// setLatencies fills the latency fields from hist.
func (r *runResult) setLatencies() {
	r.P50US = micros(r.hist.quantile(0.50))
	r.P99US = micros(r.hist.quantile(0.99))
	r.MeanUS = micros(r.hist.mean())
	r.MaxUS = micros(r.hist.max)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// client is one load-generating connection: its own transport, so its own
// keep-alive connection, issuing requests back to back. Only its goroutine
// touches it until the run is over.
type client struct {
	tr *http.Transport
	// do makes one request and reads its whole response (customTarget.do).
	do func() error

	hist       histogram
	total      int64
	errors     int64
	errorKinds map[string]int64
	// handshakes and resumed count the TLS handshakes of the client's
	// connections, and those that resumed a session; the transport's dialling
	// goroutine adds to them.
	handshakes, resumed atomic.Int64
}

// countHandshake is the client's httptrace TLSHandshakeDone.
func (c *client) countHandshake(cs tls.ConnectionState, err error) {
	if err != nil {
		return
	}
	c.handshakes.Add(1)
	if cs.DidResume {
		c.resumed.Add(1)
	}
}

// loop issues requests until the window closes (or maxRequestsPerClient),
// recording the latency of those that complete inside [from, to].
func (c *client) loop(ctx context.Context, from, to time.Time) {
	for range maxRequestsPerClient {
		t0 := time.Now()
		if !t0.Before(to) || ctx.Err() != nil {
			return
		}
		err := c.do()
		t1 := time.Now()
		c.total++
		if err != nil {
			c.fail(err)
			time.Sleep(errorBackoff)
			continue
		}
		if t1.After(from) && !t1.After(to) {
			c.hist.record(t1.Sub(t0))
		}
	}
}

func (c *client) fail(err error) {
	c.errors++
	addCount(&c.errorKinds, normalizeErr(err.Error()), 1)
}

type statusError struct {
	code   int
	reason string
}

func (e statusError) Error() string {
	if e.reason == "" {
		return fmt.Sprintf("status %d", e.code)
	}
	return fmt.Sprintf("status %d (Egressd-Reason: %s)", e.code, e.reason)
}

// newTransport builds a client's transport for t: HTTP/1.1 only (so direct and
// proxied runs speak the same protocol), no compression, no environment proxy.
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
		// Each client has its own transport, so one idle connection is its
		// keep-alive connection; clients never share or steal connections.
		MaxIdleConns:          1,
		MaxIdleConnsPerHost:   1,
		DisableKeepAlives:     t.newConnPerRequest,
		DisableCompression:    true,
		TLSHandshakeTimeout:   requestTimeout,
		ResponseHeaderTimeout: requestTimeout,
		// A non-nil, empty TLSNextProto keeps HTTP/2 off: HTTP/1.1 over TLS,
		// comparable with the plain path and with what is spliced in CONNECT.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	if t.roots != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: t.roots, MinVersion: tls.VersionTLS12}
		if t.resumeSessions {
			// One host per client, so one session is all it needs.
			tr.TLSClientConfig.ClientSessionCache = tls.NewLRUClientSessionCache(1)
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
// dials only the upstream and egressd, both on 127.0.0.1, never a name.
func loopbackOnly(addr string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return errors.New("bench dials only loopback IP literals, not " + addr)
	}
	return nil
}

package soak_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

const (
	// requestTimeout bounds one request, its body included.
	requestTimeout = 15 * time.Second
	// reconnectEvery: a client closes its idle connections after this many requests,
	// so the load keeps opening new connections, CONNECT tunnels and TLS sessions
	// (and egressd keeps closing them) instead of reusing a handful for the whole run.
	reconnectEvery = 25
	// maxBehind: a client that fell further behind its pace than this (a slow
	// request) resumes from now instead of sending back to back to catch up.
	maxBehind = time.Second
	// maxBody bounds every response body the clients read.
	maxBody = 1 << 20
)

// schedule is each client's cycle of requests; client i starts at slot i, so at
// any moment the clients send a mix. Per 16 requests: 3 plain, 2 spliced, 2
// transform, 3 credential, 2 pre-tool and 1 post-tool hook calls, 3 denials.
var schedule = []kind{
	kindPlain, kindCred, kindSplice, kindTransform, kindHookPre, kindDenyHTTP, kindCred, kindPlain,
	kindSplice, kindTransform, kindHookPost, kindDenyConnect, kindCred, kindPlain, kindHookPre, kindDenyHTTP,
}

// denial is a request egressd must refuse, with what its refusal must say.
type denial struct {
	target string // a URL (denied http) or an authority (denied CONNECT)
	status int
	reason string
	host   string
	port   int
	detail string // "" when the reason has none
}

// denials returns the refused requests of each kind, for egressd's listener and
// admin ports and the upstream's ports.
func denials(f *files) (httpDenials, connectDenials []denial) {
	self := func(port int) string { return fmt.Sprintf("%s:%d", literalSelf, port) }
	httpDenials = []denial{
		// evil.soak.test resolves to 127.0.0.1 and names the upstream's ports: were it let
		// through, the upstream would see it (and record a violation of its own).
		{fmt.Sprintf("http://%s:%d/x?y=z", hostEvil, f.httpPort), 403, "not_allowlisted", hostEvil, f.httpPort, ""},
		{"http://" + literalOther + "/", 403, "not_allowlisted", literalOther, 80, ""},
		{"http://" + literalMeta + "/latest/meta-data/", 403, "internal_address", literalMeta, 80, "metadata"},
		{fmt.Sprintf("http://%s:%d/", literalPrivate, privatePort), 403, "internal_address", literalPrivate, privatePort, "private"},
		{"http://" + hostMeta + "/latest/meta-data/", 403, "internal_address", hostMeta, 80, "metadata"},
		{"http://" + hostPrivate + "/", 403, "internal_address", hostPrivate, 80, "private"},
		{"http://" + hostPlain + ":1/", 403, "port_not_allowed", hostPlain, 1, ""},
		{fmt.Sprintf("http://%s:%d/", hostPlaintext, f.httpPort), 403, "plaintext_credential", hostPlaintext, f.httpPort, ""},
		{"http://" + self(f.adminPort) + "/metrics", 403, "internal_address", literalSelf, f.adminPort, "self"},
		{"http://" + self(f.proxyPort) + "/", 403, "internal_address", literalSelf, f.proxyPort, "self"},
	}
	connectDenials = []denial{
		{fmt.Sprintf("%s:%d", hostEvil, f.tlsPort), 403, "not_allowlisted", hostEvil, f.tlsPort, ""},
		{hostPrivate + ":443", 403, "internal_address", hostPrivate, 443, "private"},
		{hostSplice + ":1", 403, "port_not_allowed", hostSplice, 1, ""},
		{literalMeta + ":443", 403, "internal_address", literalMeta, 443, "metadata"},
		{hostMeta + ":443", 403, "internal_address", hostMeta, 443, "metadata"},
		{self(f.adminPort), 403, "internal_address", literalSelf, f.adminPort, "self"},
	}
	return httpDenials, connectDenials
}

// loader drives the clients.
type loader struct {
	e              *egressd
	f              *files
	tally          *tally
	hooks          *hookEndpoint
	egressdRoots   *x509.CertPool // intercepted tunnels: only egressd's CA
	upstreamRoots  *x509.CertPool // spliced tunnels: only the upstream's CA
	httpDenials    []denial
	connectDenials []denial
	start, stopAt  time.Time
	interval       time.Duration // between one client's requests
	maxPerClient   int

	mu      sync.Mutex
	clients []*client
}

// client is one sandbox process: its own transports, so its own connections to
// egressd, sending one request at a time.
type client struct {
	l                        *loader
	id                       int
	plain, splice, intercept *http.Client
	seq                      int
	slot                     int
	nHTTP, nConnect          int
}

func (l *loader) newClient(id int) *client {
	proxyURL := &url.URL{Scheme: "http", Host: l.e.Proxy}
	h2 := id%2 == 1 // odd clients speak HTTP/2 inside their TLS tunnels
	transport := func(roots *x509.CertPool) *http.Transport {
		return &http.Transport{
			Proxy:               http.ProxyURL(proxyURL),
			TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2:   h2,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     time.Minute,
			TLSHandshakeTimeout: 10 * time.Second,
		}
	}
	mk := func(tr *http.Transport) *http.Client {
		return &http.Client{
			Transport:     tr,
			Timeout:       requestTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	c := &client{
		l: l, id: id, slot: id % len(schedule),
		plain: mk(transport(nil)), splice: mk(transport(l.upstreamRoots)), intercept: mk(transport(l.egressdRoots)),
		nHTTP: id, nConnect: id,
	}
	l.mu.Lock()
	l.clients = append(l.clients, c)
	l.mu.Unlock()
	return c
}

// run sends requests at the client's pace until stopAt, at most maxPerClient.
func (c *client) run() {
	l := c.l
	next := l.start.Add(time.Duration(c.id) * l.interval / time.Duration(max(1, len(l.clients))))
	for i := 0; i < l.maxPerClient; i++ {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		if !time.Now().Before(l.stopAt) {
			return
		}
		next = next.Add(l.interval)
		if time.Since(next) > maxBehind {
			next = time.Now() // far behind: pace from now on rather than burst to catch up
		}
		k := schedule[c.slot%len(schedule)]
		c.slot++
		c.one(k)
		// Each client at its own phase, so the clients' connections do not all close
		// at once (the samples would see the load's connections come and go together).
		if (c.seq+c.id*7)%reconnectEvery == 0 {
			c.closeIdle()
		}
	}
}

func (c *client) closeIdle() {
	c.plain.CloseIdleConnections()
	c.splice.CloseIdleConnections()
	c.intercept.CloseIdleConnections()
}

// one sends one request of kind k and records its outcome.
func (c *client) one(k kind) {
	c.seq++
	id := fmt.Sprintf("c%d-%d", c.id, c.seq)
	start := time.Now()
	defer func() { c.l.tally.latency[k].observe(time.Since(start)) }()
	var problem string
	var err error
	switch k {
	case kindPlain, kindSplice, kindTransform, kindCred:
		problem, err = c.allowed(k, id)
	case kindHookPre, kindHookPost:
		problem, err = c.hook(k, id)
	case kindDenyHTTP:
		d := c.l.httpDenials[c.nHTTP%len(c.l.httpDenials)]
		c.nHTTP++
		problem, err = c.denyHTTP(id, d)
	case kindDenyConnect:
		d := c.l.connectDenials[c.nConnect%len(c.l.connectDenials)]
		c.nConnect++
		problem, err = c.denyConnect(id, d)
	}
	t := c.l.tally
	if err != nil {
		var certErr *tls.CertificateVerificationError
		if errors.As(err, &certErr) {
			// The tunnel was terminated by the wrong party: intercepted where it must
			// be spliced, or spliced where it must be intercepted.
			problem = "TLS: " + err.Error()
		} else {
			t.transportError(k, id, err, time.Now().After(c.l.stopAt))
			return
		}
	}
	if problem != "" {
		t.wrong[k].Add(1)
		t.violation("wrong policy: "+k.String(), "%s: %s", id, problem)
		return
	}
	t.ok[k].Add(1)
}

// exchange sends req with hc and reads the response body.
func exchange(hc *http.Client, req *http.Request) (*http.Response, []byte, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the response: %w", err)
	}
	return resp, body, nil
}

// allowed sends a request that egressd must let through, each kind with headers the
// sandbox must not be able to set or must be able to send unchanged, and checks what
// the upstream saw.
func (c *client) allowed(k kind, id string) (string, error) {
	f := c.l.f
	var (
		rawURL, host string
		hc           *http.Client
		hdr          = http.Header{idHeader: {id}}
		want         seen // what the upstream must have seen (Cred checked apart)
	)
	switch k {
	case kindPlain:
		rawURL, host, hc = fmt.Sprintf("http://%s:%d/plain?q=%s", hostPlain, f.httpPort, id), hostPlain, c.plain
		hdr.Set("Authorization", "Bearer client-plain") // no credential on this entry: passes as sent
		hdr.Set("Egressd-Forged", "1")                  // Egressd-* from the sandbox: always stripped
		want = seen{Auth: []string{"Bearer client-plain"}}
	case kindSplice:
		rawURL, host, hc = fmt.Sprintf("https://%s:%d/splice", hostSplice, f.tlsPort), hostSplice, c.splice
		// Spliced: egressd sees only TLS bytes, so everything arrives as sent.
		hdr.Set("Authorization", "Bearer client-splice")
		hdr.Set(transformHeader, "client-splice")
		want = seen{TLS: true, Auth: []string{"Bearer client-splice"}, Transform: []string{"client-splice"}}
	case kindTransform:
		rawURL, host, hc = fmt.Sprintf("https://%s:%d/xform", hostTransform, f.tlsPort), hostTransform, c.intercept
		hdr[transformHeader] = []string{"forged-1", "forged-2"} // replaced by the transform
		hdr["x-soak-transform"] = []string{"forged-lower"}      // in any case
		hdr.Set("Authorization", "Bearer client-xform")         // the transform does not set it
		hdr.Set("Egressd-Forged", "1")
		want = seen{TLS: true, Auth: []string{"Bearer client-xform"}, Transform: []string{transformMark}}
	case kindCred:
		rawURL, host, hc = fmt.Sprintf("https://%s:%d/cred", hostCred, f.tlsPort), hostCred, c.intercept
		hdr.Set("Authorization", "Bearer forged-by-the-sandbox") // replaced by the credential
		hdr["authorization"] = []string{"Bearer forged-lower"}
		hdr.Set("Egressd-Forged", "1")
		want = seen{TLS: true}
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return "", err
	}
	req.Header = hdr
	resp, body, err := exchange(hc, req)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("status %d (Egressd-Reason %q), want 200: %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"), snippet(body, 200)), nil
	}
	echoed, err := echo.Decode(body)
	got := seenOf(echoed)
	if err != nil {
		return fmt.Sprintf("200 but not the upstream's echo: %s", snippet(body, 200)), nil
	}
	var bad []string
	check := func(what string, ok bool, gotV, wantV any) {
		if !ok {
			bad = append(bad, fmt.Sprintf("%s %v, want %v", what, gotV, wantV))
		}
	}
	check("request ID", got.ID == id, got.ID, id)
	check("host", got.Host == host, got.Host, host)
	check("TLS at the upstream", got.TLS == want.TLS, got.TLS, want.TLS)
	check(transformHeader, slices.Equal(got.Transform, want.Transform), got.Transform, want.Transform)
	check("Egressd-* headers", len(got.Egressd) == 0, got.Egressd, "none")
	if k == kindCred {
		okToken := len(got.Auth) == 1 && got.Auth[0] == "Bearer "+tokenMark
		check("Authorization", okToken, redactTokens(got.Auth), "exactly the credential's")
		c.l.tally.outcome(k, "token "+got.Cred)
		// A stale or unknown token is the upstream's violation already (credTracker).
	} else {
		check("Authorization", slices.Equal(got.Auth, want.Auth), got.Auth, want.Auth)
	}
	if len(bad) > 0 {
		return strings.Join(bad, "; "), nil
	}
	c.l.tally.outcome(k, got.Proto)
	return "", nil
}

// hook posts a tool call to a hook URL, as the agent runtime's hook client does, with
// a forged assertion that egressd must replace, and checks that the answer is the
// endpoint's, byte for byte (the endpoint verified egressd's assertion).
func (c *client) hook(k kind, id string) (string, error) {
	path := hookPre
	if k == kindHookPost {
		path = hookPost
	}
	var call toolCall
	call.ToolCall.Name = "code_execution"
	call.ToolCall.Args.Cmd = "ls -la"
	call.ToolCall.Args.Call = id
	body, _ := json.Marshal(call)
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("https://%s:%d%s", hostPolicy, c.l.f.tlsPort, path), bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Egressd-Hook-Assertion", "forged-by-the-sandbox")
	resp, got, err := exchange(c.intercept, req)
	if err != nil {
		c.l.hooks.answered(id) // forget it, if the endpoint answered
		return "", err
	}
	want, answered := c.l.hooks.answered(id)
	switch {
	case answered && want.problem != "":
		return "the endpoint could not verify egressd's assertion: " + want.problem, nil
	case resp.StatusCode != http.StatusOK:
		return fmt.Sprintf("status %d, want 200: %s", resp.StatusCode, snippet(got, 200)), nil
	case resp.Header.Get("Egressd-Hook") == "fail-closed" || !answered:
		return fmt.Sprintf("not the endpoint's answer (Egressd-Hook %q, endpoint answered: %v): %s",
			resp.Header.Get("Egressd-Hook"), answered, snippet(got, 200)), nil
	case !bytes.Equal(got, want.body):
		return fmt.Sprintf("answer %s, the endpoint's was %s", snippet(got, 200), want.body), nil
	}
	if k == kindHookPre {
		var d struct {
			Decision string `json:"decision"`
		}
		_ = json.Unmarshal(got, &d)
		c.l.tally.outcome(k, d.Decision)
	} else {
		c.l.tally.outcome(k, "forwarded")
	}
	return "", nil
}

// denyHTTP sends a plain-http request egressd must refuse and checks the refusal.
func (c *client) denyHTTP(id string, d denial) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.target, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set(idHeader, id)
	resp, body, err := exchange(c.plain, req)
	if err != nil {
		return "", err
	}
	if p := checkDenial(resp, body, d); p != "" {
		return "GET " + d.target + ": " + p, nil
	}
	c.l.tally.outcome(kindDenyHTTP, denialLabel(d))
	return "", nil
}

// denyConnect sends a CONNECT egressd must refuse, on a connection of its own, and
// checks the refusal.
func (c *client) denyConnect(id string, d denial) (string, error) {
	nc, err := net.DialTimeout("tcp", c.l.e.Proxy, requestTimeout)
	if err != nil {
		return "", err
	}
	defer nc.Close()
	if err := nc.SetDeadline(time.Now().Add(requestTimeout)); err != nil {
		return "", err
	}
	if _, err := fmt.Fprintf(nc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s: %s\r\n\r\n", d.target, d.target, idHeader, id); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(nc), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "", fmt.Errorf("CONNECT %s: %w", d.target, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return "", fmt.Errorf("CONNECT %s: reading the response: %w", d.target, err)
	}
	if p := checkDenial(resp, body, d); p != "" {
		return "CONNECT " + d.target + ": " + p, nil
	}
	c.l.tally.outcome(kindDenyConnect, denialLabel(d))
	return "", nil
}

func denialLabel(d denial) string {
	if d.detail != "" {
		return d.reason + " (" + d.detail + ")"
	}
	return d.reason
}

// checkDenial checks a refusal: status, Egressd-Reason, and the JSON body every
// refusal carries (docs/reasons.md).
func checkDenial(resp *http.Response, body []byte, d denial) string {
	var got egressdtest.Refusal
	if resp.StatusCode != d.status || resp.Header.Get("Egressd-Reason") != d.reason {
		return fmt.Sprintf("%d with Egressd-Reason %q, want %d %q: %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"),
			d.status, d.reason, snippet(body, 200))
	}
	if err := json.Unmarshal(body, &got); err != nil {
		return fmt.Sprintf("body is not JSON: %s", snippet(body, 200))
	}
	if got.Error != "egress_denied" || got.Reason != d.reason || got.Detail != d.detail || got.Host != d.host ||
		got.Port != d.port || got.Message == "" || got.RequestID == "" {
		return fmt.Sprintf("body %s, want egress_denied reason %q detail %q host %q port %d, a message and a request_id",
			snippet(body, 300), d.reason, d.detail, d.host, d.port)
	}
	return ""
}

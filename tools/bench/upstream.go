package main

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// What a far side (the upstream, the hook endpoint) counts of the requests it
// receives: injected values exactly once with the exact value, so a run can be
// checked against what egressd had to inject.
const (
	cServed    = iota
	cBadBody   // hook: not a POST of hookBodySize bytes
	cAsserted  // hook: exactly one non-empty assertion
	cVerified  // hook: sampled assertions pkg/hookauth accepted
	cRefused   // hook: sampled assertions it refused
	cAccepted  // connections accepted
	cInjected  // then one per injections[i], exactly once with the exact value
	cTransform = cInjected
	numCounts  = cInjected + len(injections)
)

// tally is a far side's counters; a run's figures are the difference of two
// snapshots.
type tally struct {
	srv *echo.Server // counts the connections
	n   [numCounts]atomic.Int64
}

type counts [numCounts]int64

func (t *tally) counts() (c counts) {
	for i := range t.n {
		c[i] = t.n[i].Load()
	}
	c[cAccepted] = t.srv.Conns() // the echo server counts them
	return c
}

func (c counts) sub(o counts) counts {
	for i := range c {
		c[i] -= o[i]
	}
	return c
}

// fill sets a run's far-side figures from the counts it grew by.
func (r *runResult) fill(c counts) {
	r.UpstreamConns, r.UpstreamRequests = c[cAccepted], c[cServed]
	for i, inj := range injections {
		if n := c[cInjected+i]; n > 0 {
			addCount(&r.Injected, inj.name, n)
		}
	}
}

// serve starts t's echo server with h on a loopback port of its own per cert
// (nil: plain HTTP/1.1; else HTTPS, h2 and http/1.1 by ALPN).
func (t *tally) serve(h http.HandlerFunc, certs ...*tls.Certificate) ([]string, error) {
	t.srv = &echo.Server{Route: func(w http.ResponseWriter, r *http.Request) bool { h(w, r); return true }, Forget: true}
	var addrs []string
	for _, c := range certs {
		port, err := t.srv.Listen("127.0.0.1:0", c)
		if err != nil {
			t.srv.Close()
			return nil, err
		}
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(port))
	}
	return addrs, nil
}

// upstream is the in-process origin every path ends at, answering every
// request with the same body of -size bytes.
type upstream struct {
	tally
	httpAddr, tlsAddr string // 127.0.0.1:port
	caPEM             []byte // the throwaway CA that signed the HTTPS leaf
	roots             *x509.CertPool
	cert              tls.Certificate // the leaf, also the hook endpoint's and the transparent stand-in's
	appKey            string          // the github_app path's App key (PEM)
	hook              *hookServer     // when the hook path runs: egressd's config names it
}

// upstreamNames are the names the HTTPS leaf is valid for: localhost (plain,
// connect) and the intercepted paths' hosts, one allowlist entry each.
var upstreamNames = []string{"localhost", "bench.test", "*.bench.test", "127.0.0.1"}

// What egressd injects on the intercepted paths. The vault path's token
// differs from the file's, so the upstream can tell which backend set it.
const (
	transformHeader      = "X-Bench-Injected"
	echoHeader           = "X-Bench-Echo" // the upstream's reflection of Authorization
	transformValue       = "bench-transform-value"
	credentialID         = "bench-cred"
	credentialToken      = "bench-fake-token-not-a-secret"
	vaultCredentialToken = "bench-fake-vault-token-not-a-secret"
	// egressd exchanges the oauth2 credential's refresh token at oauthTokenPath.
	oauthCredentialID = "bench-oauth"
	oauthAccessToken  = "bench-fake-access-token-not-a-secret"
	oauthTokenPath    = "/oauth/token"
	// egressd mints the github_app credential's installation token at githubTokenPath.
	githubCredentialID = "bench-github"
	githubToken        = "ghs_bench-fake-installation-token-not-a-secret"
	githubTokenPath    = "/app/installations/1/access_tokens"
)

func startUpstream(size int) (*upstream, error) {
	ca, err := testpki.NewCA("egressd bench CA")
	if err != nil {
		return nil, err
	}
	leaf, err := ca.NewLeaf(upstreamNames...)
	if err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	u := &upstream{caPEM: ca.PEM(), roots: ca.Pool, cert: leaf,
		appKey: string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))}
	addrs, err := u.serve(u.fixedBody(size), nil, &u.cert)
	if err != nil {
		return nil, err
	}
	u.httpAddr, u.tlsAddr = addrs[0], addrs[1]
	return u, nil
}

func (u *upstream) close() { u.srv.Close() }

// fixedBody answers every request with size bytes and a Content-Length (no
// chunked framing on either side), counts the injected values cheaply (a map
// lookup and a compare) and reflects Authorization in echoHeader, so the
// credential paths measure egressd scrubbing it.
func (u *upstream) fixedBody(size int) http.HandlerFunc {
	body := bytes.Repeat([]byte("x"), size)
	length, ctype := []string{strconv.Itoa(size)}, []string{"application/octet-stream"}
	return func(w http.ResponseWriter, r *http.Request) {
		if serveToken(w, r) {
			return
		}
		u.n[cServed].Add(1)
		if r.URL.Path == placeholderPath {
			servePlaceholder(w, r, body)
			return
		}
		if r.URL.Path == awsPath && !awsVerified(r) {
			http.Error(w, "the signature does not verify under the real keys", http.StatusForbidden)
			return
		}
		u.countInjected(r)
		hdr := w.Header()
		if v := r.Header["Authorization"]; len(v) == 1 {
			hdr[echoHeader] = v
		}
		hdr["Content-Length"], hdr["Content-Type"] = length, ctype
		_, _ = w.Write(body)
	}
}

// serveToken answers egressd's token calls, which are no requests of a run:
// the oauth2 credential's refresh-token grant, the github_app credential's
// installation token.
func serveToken(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case r.Method != http.MethodPost:
		return false
	case r.URL.Path == oauthTokenPath:
		w.Header()["Content-Type"] = []string{"application/json"}
		_, _ = fmt.Fprintf(w, `{"access_token": %q, "token_type": "Bearer", "expires_in": 3600}`, oauthAccessToken)
	case r.URL.Path == githubTokenPath:
		w.Header()["Content-Type"] = []string{"application/json"}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"token": %q, "expires_at": %q}`, githubToken, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	default:
		return false
	}
	return true
}

func (t *tally) countInjected(r *http.Request) {
	for i, inj := range injections {
		if v := r.Header[inj.header]; len(v) == 1 && v[0] == inj.value {
			t.n[cInjected+i].Add(1)
		}
	}
}

// localhostAddr turns 127.0.0.1:port into localhost:port: egressd decides on
// the name and resolves it, as it would a real host.
func localhostAddr(addr string) string { return hostAt("localhost", addr) }

// hostAt is host with addr's port: the name a client asks for where only
// the address is known.
func hostAt(host, addr string) string { return host + addr[strings.LastIndexByte(addr, ':'):] }

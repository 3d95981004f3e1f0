package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// upstream is the in-process origin every path ends at: an echo server
// (internal/testutil/echo) with plain HTTP/1.1 on one loopback port and HTTPS
// (h2 and http/1.1 by ALPN) on another, whose one route answers every request
// with the same body of the configured size. The echo counts the connections it
// accepts, so a report can tell keep-alive from reconnection on the far side of
// egressd.
type upstream struct {
	srv      *echo.Server
	httpAddr string // 127.0.0.1:port
	tlsAddr  string // 127.0.0.1:port
	caPEM    []byte // the throwaway CA that signed the HTTPS leaf
	roots    *x509.CertPool

	served     atomic.Int64 // requests answered
	transform  atomic.Int64 // requests carrying exactly transformHeader: transformValue
	credential atomic.Int64 // requests carrying exactly Authorization: Bearer credentialToken
	vaultCred  atomic.Int64 // requests carrying exactly Authorization: Bearer vaultCredentialToken
	oauthCred  atomic.Int64 // requests carrying exactly Authorization: Bearer oauthAccessToken
	tokenCalls atomic.Int64 // oauth2 token calls egressd made (oauthTokenPath); not in served
	// hook is the hook path's policy endpoint (hook.go), when that path runs:
	// egressd's config then names it in hooks.json and its allowlist.
	hook *hookServer
	// cert is the HTTPS leaf, also for the hook endpoint (hook.go) and the
	// transparent path's stand-in address (transparent.go).
	cert tls.Certificate
}

// upstreamNames are the names the HTTPS leaf is valid for: "localhost" for the
// plain and connect paths, and the hosts in benchZone (answered by the DNS
// stub) for the intercepted ones, which need an allowlist entry each; and
// 127.0.0.1.
var upstreamNames = []string{"localhost", "bench.test", "*.bench.test", "127.0.0.1"}

// What egressd injects on the intercepted paths, and the upstream checks on
// every request: a transform sets transformHeader, the credential (a fake
// token in the temp dir's credentials.json) sets Authorization. On the vault
// path the same credential ID holds another fake token, in Vault, so that the
// upstream can tell which backend a request's header came from.
const (
	transformHeader      = "X-Bench-Injected"
	echoHeader           = "X-Bench-Echo" // the upstream's reflection of Authorization
	transformValue       = "bench-transform-value"
	credentialID         = "bench-cred"
	credentialToken      = "bench-fake-token-not-a-secret"
	vaultCredentialToken = "bench-fake-vault-token-not-a-secret"
	// The oauth2 path's credential: egressd exchanges its fake refresh token at
	// oauthTokenPath on this upstream for oauthAccessToken, valid for an hour.
	oauthCredentialID = "bench-oauth"
	oauthAccessToken  = "bench-fake-access-token-not-a-secret"
	oauthTokenPath    = "/oauth/token"
)

var (
	credentialAuth      = "Bearer " + credentialToken
	vaultCredentialAuth = "Bearer " + vaultCredentialToken
	oauthAuth           = "Bearer " + oauthAccessToken
	oauthTokenResponse  = []byte(`{"access_token": "` + oauthAccessToken + `", "token_type": "Bearer", "expires_in": 3600}`)
)

// upstreamCounts is a snapshot of the upstream's counters; a run's figures are
// the difference of two.
type upstreamCounts struct {
	accepted, served, transform, credential, vaultCred, oauthCred int64
}

func (u *upstream) counts() upstreamCounts {
	return upstreamCounts{u.srv.Conns(), u.served.Load(), u.transform.Load(), u.credential.Load(), u.vaultCred.Load(), u.oauthCred.Load()}
}

func (c upstreamCounts) sub(o upstreamCounts) upstreamCounts {
	return upstreamCounts{c.accepted - o.accepted, c.served - o.served, c.transform - o.transform,
		c.credential - o.credential, c.vaultCred - o.vaultCred, c.oauthCred - o.oauthCred}
}

func startUpstream(size int) (*upstream, error) {
	ca, err := testpki.NewCA("egressd bench CA")
	if err != nil {
		return nil, err
	}
	leaf, err := ca.NewLeaf(upstreamNames...)
	if err != nil {
		return nil, err
	}
	u := &upstream{caPEM: ca.PEM(), roots: ca.Pool, cert: leaf}
	h := u.fixedBody(size)
	u.srv = &echo.Server{Route: func(w http.ResponseWriter, r *http.Request) bool { h.ServeHTTP(w, r); return true }, Forget: true}
	httpPort, err := u.srv.Listen("127.0.0.1:0", nil)
	tlsPort := 0
	if err == nil {
		tlsPort, err = u.srv.Listen("127.0.0.1:0", &u.cert)
	}
	if err != nil {
		u.close()
		return nil, err
	}
	u.httpAddr, u.tlsAddr = "127.0.0.1:"+strconv.Itoa(httpPort), "127.0.0.1:"+strconv.Itoa(tlsPort)
	return u, nil
}

func (u *upstream) close() { u.srv.Close() }

// fixedBody answers every request with size bytes and an explicit
// Content-Length, so neither side pays for chunked framing. It counts the
// requests, and those that carry the injected headers exactly once with the
// exact value (two map lookups, a string compare or two, an atomic add or two),
// and sends any Authorization back in echoHeader.
func (u *upstream) fixedBody(size int) http.Handler {
	body := bytes.Repeat([]byte("x"), size)
	length := []string{strconv.Itoa(size)}
	ctype := []string{"application/octet-stream"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == oauthTokenPath && r.Method == http.MethodPost {
			u.tokenCalls.Add(1)
			w.Header()["Content-Type"] = []string{"application/json"}
			_, _ = w.Write(oauthTokenResponse)
			return
		}
		u.served.Add(1)
		if r.URL.Path == placeholderPath {
			servePlaceholder(w, r, body)
			return
		}
		if v := r.Header[transformHeader]; len(v) == 1 && v[0] == transformValue {
			u.transform.Add(1)
		}
		hdr := w.Header()
		if v := r.Header["Authorization"]; len(v) == 1 {
			switch v[0] {
			case credentialAuth:
				u.credential.Add(1)
			case vaultCredentialAuth:
				u.vaultCred.Add(1)
			case oauthAuth:
				u.oauthCred.Add(1)
			}
			// Reflect it, as an echoing upstream would: egressd masks it in the
			// response (scrubbing), so the credential paths measure a scrubbed
			// response, replacement included.
			hdr[echoHeader] = v
		}
		hdr["Content-Length"] = length
		hdr["Content-Type"] = ctype
		_, _ = w.Write(body)
	})
}

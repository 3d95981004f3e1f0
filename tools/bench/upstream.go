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

// upstream is the in-process origin every path ends at: an echo server with
// plain HTTP/1.1 on one loopback port and HTTPS (h2 and http/1.1 by ALPN) on
// another, answering every request with the same body of -size bytes. It
// counts what arrived, so a report can tell keep-alive from reconnection and
// check what egressd injected.
type upstream struct {
	srv      *echo.Server
	httpAddr string // 127.0.0.1:port
	tlsAddr  string // 127.0.0.1:port
	caPEM    []byte // the throwaway CA that signed the HTTPS leaf
	roots    *x509.CertPool
	cert     tls.Certificate // the leaf, also the hook endpoint's and the transparent stand-in's

	served     atomic.Int64 // requests answered
	transform  atomic.Int64 // each counts requests carrying exactly its value
	credential atomic.Int64
	vaultCred  atomic.Int64
	oauthCred  atomic.Int64
	tokenCalls atomic.Int64 // oauth2 token calls egressd made; not in served
	hook       *hookServer  // when the hook path runs: egressd's config names it
}

// upstreamNames are the names the HTTPS leaf is valid for: localhost (plain,
// connect) and the intercepted paths' hosts, one allowlist entry each.
var upstreamNames = []string{"localhost", "bench.test", "*.bench.test", "127.0.0.1"}

// What egressd injects on the intercepted paths, and the upstream checks on
// every request. The vault path's token differs from the file's, so the
// upstream can tell which backend a header came from.
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
)

var (
	credentialAuth      = "Bearer " + credentialToken
	vaultCredentialAuth = "Bearer " + vaultCredentialToken
	oauthAuth           = "Bearer " + oauthAccessToken
	oauthTokenResponse  = []byte(`{"access_token": "` + oauthAccessToken + `", "token_type": "Bearer", "expires_in": 3600}`)
)

// upstreamCounts is a snapshot of the upstream's counters.
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

// fillUpstream sets a run's far-side figures from the counts it grew by.
func (r *runResult) fillUpstream(d upstreamCounts) {
	r.UpstreamConns, r.UpstreamRequests = d.accepted, d.served
	r.Transformed, r.Credentialed, r.VaultCredentialed, r.OAuthCredentialed = d.transform, d.credential, d.vaultCred, d.oauthCred
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

// fixedBody answers every request with size bytes and a Content-Length (no
// chunked framing on either side), counts the injected values cheaply (a map
// lookup and a compare) and reflects Authorization in echoHeader.
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
			// Reflected, so the credential paths measure egressd scrubbing it.
			hdr[echoHeader] = v
		}
		hdr["Content-Length"] = length
		hdr["Content-Type"] = ctype
		_, _ = w.Write(body)
	})
}

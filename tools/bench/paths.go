package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"
)

// pathSpec is one way traffic can cross egressd, measured twice: direct to the
// upstream and through egressd, with everything else equal. A new path (an
// intercepted one, or a new connection per request) is one more entry in paths.
type pathSpec struct {
	name     string
	desc     string
	direct   func(*world) target
	viaProxy func(*world) target
	// inject is what egressd must add to every request of this path; the
	// upstream checks every request, and a run through egressd where any
	// request lacks it (or a path without injection where any has it) fails.
	inject injection
	// newConn: one TCP and TLS handshake per request, so req/s is also
	// handshakes/s.
	newConn bool
	// vault: through the second egressd, whose credentials come from the
	// Vault dev server the bench starts (vault.go), not the first one's file.
	vault bool
	// measure, when set, replaces measurePath (and direct and viaProxy are
	// unused): the path makes its own runs and returns its rows, or one row
	// with Skipped set (hook.go, transparent.go).
	measure func(context.Context, pathEnv) ([]pathResult, error)
	// peers is which peer proxies (peers.go) also carry this path's load,
	// each round right after egressd.
	peers peerUse
}

// injection is what an allowlist entry adds to the requests of a path.
type injection int

const (
	injectNone            injection = iota
	injectTransform                 // transformHeader: transformValue, from the entry's transform
	injectCredential                // Authorization: Bearer credentialToken, from credentials.json
	injectVaultCredential           // Authorization: Bearer vaultCredentialToken, from Vault
	injectOAuth                     // Authorization: Bearer oauthAccessToken, from the oauth2 token endpoint
)

func (i injection) String() string {
	switch i {
	case injectTransform:
		return transformHeader + " (transform)"
	case injectCredential:
		return "Authorization (credential " + credentialID + ")"
	case injectVaultCredential:
		return "Authorization (credential " + credentialID + " from Vault)"
	case injectOAuth:
		return "Authorization (oauth2 credential " + oauthCredentialID + ")"
	}
	return "nothing"
}

// world is what a path's targets are made from: the running upstream and egressd.
type world struct {
	up    *upstream
	proxy string // http://127.0.0.1:port, egressd's bench listener
	// egressdRoots holds egressd's CA (from /ca.pem on its admin listener):
	// what a client of an intercepted tunnel must trust.
	egressdRoots *x509.CertPool
	// peers are the peer proxies measured beside egressd (peers.go); nil
	// for none.
	peers *peerSet
}

// Hosts of the intercepted paths: one allowlist entry each (benchConfig),
// resolved by the DNS stub.
const (
	transformHost  = "inject." + benchZone
	credentialHost = "cred." + benchZone
	oauthHost      = "oauth." + benchZone
)

// target is one side of a path: the URL every request asks for and how the
// client reaches it.
type target struct {
	url string
	// proxy is egressd's URL, or "" for direct. For http:// URLs the client
	// sends absolute-form requests to it; for https:// it tunnels with CONNECT.
	proxy string
	// dialAddr, when set, is where every dial goes whatever the URL's host
	// resolves to (direct runs: the upstream's literal address, so a "::1
	// localhost" line in /etc/hosts cannot change what is measured).
	dialAddr string
	// roots are the CAs the client trusts for https:// URLs.
	roots *x509.CertPool
	// newConnPerRequest turns keep-alive off: one TCP (and TLS) handshake per
	// request.
	newConnPerRequest bool
	// resumeSessions gives the client a TLS session cache, so that a new
	// connection can resume the session of the one before.
	resumeSessions bool
	// allowDial vets every address dialled; nil means loopbackOnly.
	allowDial func(addr string) error
	// dialFrom, when set, makes the connection (transparent: from the
	// sandbox's network namespace); nil dials from this process's namespace.
	dialFrom func(ctx context.Context, network, addr string) (net.Conn, error)
}

// paths lists every path the bench knows, in the order it runs them.
var paths = []pathSpec{
	{
		name: "plain",
		desc: "GET http://localhost:<port>/, keep-alive; through egressd as absolute-form",
		direct: func(w *world) target {
			return target{url: w.httpURL(), dialAddr: w.up.httpAddr}
		},
		viaProxy: func(w *world) target {
			return target{url: w.httpURL(), proxy: w.proxy}
		},
		peers: peersTunnel,
	},
	{
		name: "connect",
		desc: "GET https://localhost:<port>/ over HTTP/1.1 keep-alive; through egressd in a CONNECT tunnel (spliced)",
		direct: func(w *world) target {
			return target{url: w.httpsURL(), dialAddr: w.up.tlsAddr, roots: w.up.roots}
		},
		viaProxy: func(w *world) target {
			return target{url: w.httpsURL(), proxy: w.proxy, roots: w.up.roots}
		},
		peers: peersTunnel,
	},
	withPeers(interceptPath("intercept", transformHost, injectTransform, false,
		"GET https://"+transformHost+":<port>/ over HTTP/1.1 keep-alive; through egressd intercepted (client trusts egressd's CA), a transform sets "+transformHeader), peersIntercept),
	withPeers(interceptPath("intercept-newconn", transformHost, injectTransform, true,
		"as intercept, but a new TCP+TLS connection per request (handshakes/s; egressd's leaf cache warm); direct: a new TLS connection per request"), peersIntercept),
	resumePath(),
	interceptPath("credential", credentialHost, injectCredential, false,
		"as intercept, but the entry names a file-backed credential (Authorization: Bearer) instead of a transform"),
	interceptPath("oauth2", oauthHost, injectOAuth, false,
		"as credential, but the entry names a file-backed oauth2 credential: the access token egressd got from the upstream's token endpoint (refresh-token grant, cached for its hour)"),
	vaultPath(),
	placeholderPathSpec(),
	hookPathSpec(),
	transparentPathSpec(),
	idlePathSpec(), // not in defaultPaths: about 20-30 s (make bench-idle)
}

// vaultPath is the credential path through a second egressd, identical but for
// credentials.backend vault: the same entry and credential ID, the token read
// from a Vault dev server. Vault is never on the request path after the first
// read, so it should cost what the credential path costs.
func vaultPath() pathSpec {
	p := interceptPath("vault", credentialHost, injectVaultCredential, false,
		"as credential, but through a second egressd whose credentials.backend is vault: the token is read from a Vault dev server (KV v2, refresh "+vaultRefresh.String()+") the bench starts; skipped without one")
	p.vault = true
	return p
}

// resumePath is intercept-newconn with a TLS session cache in each client: every
// reconnection offers the session of the connection before, so the handshakes
// measured are resumptions wherever the server honours them.
func resumePath() pathSpec {
	p := interceptPath("intercept-resume", transformHost, injectTransform, true,
		"as intercept-newconn, but each client keeps a TLS session cache, so every reconnection offers to resume (handshakes/s of resumed sessions); direct: the same against the upstream")
	p.direct, p.viaProxy = resuming(p.direct), resuming(p.viaProxy)
	return p
}

// resuming is mk's target with a session cache in its clients.
func resuming(mk func(*world) target) func(*world) target {
	return func(w *world) target {
		t := mk(w)
		t.resumeSessions = true
		return t
	}
}

// interceptPath is an HTTPS path to host whose allowlist entry injects inj, so
// egressd terminates the tunnel with a leaf from its CA. The direct run is TLS
// to the upstream, with the same keep-alive setting.
func interceptPath(name, host string, inj injection, newConn bool, desc string) pathSpec {
	return pathSpec{
		name:    name,
		desc:    desc,
		inject:  inj,
		newConn: newConn,
		direct: func(w *world) target {
			return target{url: w.hostURL(host), dialAddr: w.up.tlsAddr, roots: w.up.roots, newConnPerRequest: newConn}
		},
		viaProxy: func(w *world) target {
			return target{url: w.hostURL(host), proxy: w.proxy, roots: w.egressdRoots, newConnPerRequest: newConn}
		},
	}
}

func (w *world) httpURL() string  { return "http://" + localhostAddr(w.up.httpAddr) + "/" }
func (w *world) httpsURL() string { return "https://" + localhostAddr(w.up.tlsAddr) + "/" }

// hostURL is https://host:<the upstream's TLS port>/.
func (w *world) hostURL(host string) string {
	return "https://" + host + w.up.tlsAddr[strings.LastIndexByte(w.up.tlsAddr, ':'):] + "/"
}

// intercepts reports whether any of ps goes through the first egressd's
// intercepted tunnels (and so needs its CA).
func intercepts(ps []pathSpec) bool {
	return slices.ContainsFunc(ps, func(p pathSpec) bool { return p.inject != injectNone && !p.vault })
}

// needsVault reports whether any of ps runs through the Vault-backed egressd.
func needsVault(ps []pathSpec) bool {
	return slices.ContainsFunc(ps, func(p pathSpec) bool { return p.vault })
}

// localhostAddr turns 127.0.0.1:port into localhost:port: egressd decides on
// the name and resolves it through the system resolver, as it would a real host.
func localhostAddr(addr string) string {
	return "localhost" + addr[strings.LastIndexByte(addr, ':'):]
}

func pathNames() []string {
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = p.name
	}
	return names
}

// lookupPaths parses -paths: names from paths, comma-separated, each once,
// run in the order given.
func lookupPaths(list string) ([]pathSpec, error) {
	var out []pathSpec
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		i := slices.IndexFunc(paths, func(p pathSpec) bool { return p.name == name })
		if i < 0 {
			return nil, fmt.Errorf("-paths: unknown path %q (known: %s)", name, strings.Join(pathNames(), ", "))
		}
		if slices.ContainsFunc(out, func(p pathSpec) bool { return p.name == name }) {
			return nil, fmt.Errorf("-paths: %q given twice", name)
		}
		out = append(out, paths[i])
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-paths: name at least one of %s", strings.Join(pathNames(), ", "))
	}
	return out, nil
}

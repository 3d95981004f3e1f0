package main

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
)

// pathSpec is one way traffic can cross egressd, measured direct to the
// upstream and through egressd, with everything else equal.
type pathSpec struct {
	name, desc       string
	direct, viaProxy func(*world) target
	// inject is what egressd must add to every request of the path; the
	// upstream checks every request (injectionProblems).
	inject  injection
	injects string // what the report says is injected, when inject does not say it
	// own, when set, is the setup of an egressd of the path's own (own.go).
	own func(context.Context, pathEnv) (ownSetup, error)
	// measure, when set, replaces measurePath: the path makes its own runs and
	// returns its rows, or one row with Skipped set.
	measure func(context.Context, pathEnv) ([]pathResult, error)
	peers   peerUse // which peer proxies also carry the load
}

// injection is what an allowlist entry adds to the requests of a path: header
// set to value, exactly once. The upstream counts each (tally.countInjected).
type injection struct{ name, header, value string }

func (i injection) String() string { return i.header + " (" + i.name + ")" }

var (
	injectNone            = injection{}
	injectTransform       = injection{"transform", transformHeader, transformValue}
	injectCredential      = injection{"credential " + credentialID, "Authorization", "Bearer " + credentialToken}
	injectVaultCredential = injection{"credential " + credentialID + " from Vault", "Authorization", "Bearer " + vaultCredentialToken}
	injectOAuth           = injection{"oauth2 credential " + oauthCredentialID, "Authorization", "Bearer " + oauthAccessToken}
	injectGitHub          = injection{"github_app credential " + githubCredentialID + ", git", "Authorization",
		"Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+githubToken))}
	// injections are the ones the upstream counts, transform first (cTransform).
	injections = [...]injection{injectTransform, injectCredential, injectVaultCredential, injectOAuth, injectGitHub}
)

// world is what a path's targets are made from.
type world struct {
	up           *upstream
	proxy        string            // http://127.0.0.1:port, egressd's bench listener
	egressdRoots *x509.CertPool    // egressd's CA: what an intercepted tunnel's client trusts
	peers        peerSet           // nil for none
	vars         map[string]string // the sandbox's environment (GET /v1/sandbox/env) of a path's own egressd
}

// Hosts of the intercepted paths: one allowlist entry each, resolved by the DNS stub.
const (
	transformHost  = "inject." + benchZone
	credentialHost = "cred." + benchZone
	oauthHost      = "oauth." + benchZone
	githubHost     = "github." + benchZone
)

// paths lists every path the bench knows, in the order it runs them.
var paths = []pathSpec{
	{
		name:     "plain",
		desc:     "GET http://localhost:<port>/, keep-alive; through egressd as absolute-form",
		direct:   func(w *world) target { return target{url: w.httpURL(), dialAddr: w.up.httpAddr} },
		viaProxy: func(w *world) target { return target{url: w.httpURL(), proxy: w.proxy} },
		peers:    peersTunnel,
	},
	{
		name: "connect",
		desc: "GET https://localhost:<port>/ over HTTP/1.1 keep-alive; through egressd in a CONNECT tunnel (spliced)",
		direct: func(w *world) target {
			return target{url: w.hostURL("localhost"), dialAddr: w.up.tlsAddr, roots: w.up.roots}
		},
		viaProxy: func(w *world) target { return target{url: w.hostURL("localhost"), proxy: w.proxy, roots: w.up.roots} },
		peers:    peersTunnel,
	},
	interceptPath("intercept", transformHost, injectTransform, peersIntercept, target{},
		"GET https://"+transformHost+":<port>/ over HTTP/1.1 keep-alive; through egressd intercepted (client trusts egressd's CA), a transform sets "+transformHeader),
	interceptPath("intercept-newconn", transformHost, injectTransform, peersIntercept, target{newConnPerRequest: true},
		"as intercept, but a new TCP+TLS connection per request (handshakes/s; egressd's leaf cache warm); direct: a new TLS connection per request"),
	interceptPath("intercept-resume", transformHost, injectTransform, peersNone, target{newConnPerRequest: true, resumeSessions: true},
		"as intercept-newconn, but each client keeps a TLS session cache, so every reconnection offers to resume (handshakes/s of resumed sessions); direct: the same against the upstream"),
	interceptPath("credential", credentialHost, injectCredential, peersNone, target{},
		"as intercept, but the entry names a file-backed credential (Authorization: Bearer) instead of a transform"),
	interceptPath("oauth2", oauthHost, injectOAuth, peersNone, target{},
		"as credential, but the entry names a file-backed oauth2 credential: the access token egressd got from the upstream's token endpoint (refresh-token grant, cached for its hour)"),
	interceptPath("github_app", githubHost, injectGitHub, peersNone, target{},
		"as oauth2, but a github_app credential on a \"github\": \"git\" entry: the installation token egressd minted at the upstream's token endpoint (App JWT, cached for its hour), sent as HTTP Basic x-access-token"),
	vaultPath(),
	{name: placeholderRow, own: ownConfigSetup(placeholderConfig),
		desc:     fmt.Sprintf("POST of a %d-byte JSON body carrying an environment_variable credential's placeholder to https://%s:<port>%s, keep-alive; through an egressd of its own (policy file with env), intercepted, the placeholder replaced in the body; direct: the same body with the value", placeholderBodySize, placeholderHost, placeholderPath),
		injects:  "the value of " + placeholderCredential + " in place of its placeholder (body)",
		direct:   func(w *world) target { return w.directTLS(placeholderTarget(w, placeholderValue)) },
		viaProxy: func(w *world) target { return w.viaEgressd(placeholderTarget(w, w.vars[placeholderEnvName])) },
	},
	{name: awsRow, own: ownConfigSetup(awsConfig),
		desc:    "GET https://" + awsHost + ":<port>" + awsPath + " signed (SigV4, s3) with an aws credential's placeholder pair, keep-alive; through an egressd of its own (policy file with env), intercepted, signed again with the real keys, which the upstream verifies; direct: signed with the real keys",
		injects: "Authorization, X-Amz-Date (aws credential " + awsCredential + ", signed again)",
		direct:  func(w *world) target { return w.directTLS(awsTarget(w, awsKeyID, awsSecret)) },
		viaProxy: func(w *world) target {
			return w.viaEgressd(awsTarget(w, w.vars["AWS_ACCESS_KEY_ID"], w.vars["AWS_SECRET_ACCESS_KEY"]))
		},
	},
	hookPathSpec(),
	transparentPathSpec(),
	nodePathSpec(),
}

// vaultPath is the credential path through a second egressd whose token comes
// from Vault; Vault is never on the request path after the first read.
func vaultPath() pathSpec {
	p := interceptPath("vault", credentialHost, injectVaultCredential, peersNone, target{},
		"as credential, but through a second egressd whose credentials.backend is vault: the token is read from a Vault dev server (KV v2, refresh "+vaultRefresh.String()+") the bench starts; skipped without one")
	p.own = vaultSetup
	return p
}

// interceptPath is an HTTPS path to host whose entry injects inj, so egressd
// terminates the tunnel with a leaf from its CA; t says how clients connect.
func interceptPath(name, host string, inj injection, peers peerUse, t target, desc string) pathSpec {
	return pathSpec{name: name, desc: desc, inject: inj, peers: peers,
		direct:   func(w *world) target { d := t; d.url = w.hostURL(host); return w.directTLS(d) },
		viaProxy: func(w *world) target { v := t; v.url = w.hostURL(host); return w.viaEgressd(v) },
	}
}

// through is w with proxy, a listener of e, as the proxy, and e's CA as what
// the clients of intercepted tunnels trust; no peer carries it.
func (w *world) through(e *egressd, proxy string) (*world, error) {
	t := *w
	t.proxy, t.peers = proxy, nil
	var err error
	t.egressdRoots, err = e.CAPool()
	return &t, err
}

// directTLS is t dialled straight to the upstream's TLS port.
func (w *world) directTLS(t target) target { t.dialAddr, t.roots = w.up.tlsAddr, w.up.roots; return t }

// viaEgressd is t through egressd, intercepted: the client trusts egressd's CA.
func (w *world) viaEgressd(t target) target { t.proxy, t.roots = w.proxy, w.egressdRoots; return t }

func (w *world) httpURL() string { return "http://" + localhostAddr(w.up.httpAddr) + "/" }

// hostURL is https://host:<the upstream's TLS port>/.
func (w *world) hostURL(host string) string { return "https://" + hostAt(host, w.up.tlsAddr) + "/" }

func (p pathSpec) key() string { return p.name }

// names is the key of each of all.
func names[T any](all []T, key func(T) string) []string {
	out := make([]string, len(all))
	for i, x := range all {
		out[i] = key(x)
	}
	return out
}

// pick parses flag's comma-separated list: keys of all, each once, in the
// order given.
func pick[T any](flag, list string, all []T, key func(T) string) ([]T, error) {
	known := strings.Join(names(all, key), ", ")
	var out []T
	for name := range strings.SplitSeq(list, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		i := slices.IndexFunc(all, func(x T) bool { return key(x) == name })
		switch {
		case i < 0:
			return nil, fmt.Errorf("%s: unknown name %q (known: %s)", flag, name, known)
		case slices.Contains(names(out, key), name):
			return nil, fmt.Errorf("%s: %q given twice", flag, name)
		}
		out = append(out, all[i])
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: name at least one of %s", flag, known)
	}
	return out, nil
}

// lookupPaths parses -paths.
func lookupPaths(list string) ([]pathSpec, error) { return pick("-paths", list, paths, pathSpec.key) }

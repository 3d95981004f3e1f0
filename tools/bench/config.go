package main

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// The bench's egressd configs: the full request path, the JSON log line per
// request at info included (it is part of the cost), with loopback opened
// (unsafe_allow_cidrs) since the upstream lives there.

const (
	benchListener   = "bench"
	stateDir        = "state" // where egressd generates its CA
	upstreamCAFile  = "bench-ca.pem"
	credentialsFile = "credentials.json"
	// benchZone is the zone the DNS stub answers, all with 127.0.0.1: egressd
	// decides interception per entry, so each intercepted path needs a host
	// of its own, and only localhost resolves without DNS.
	benchZone = "bench.test"
)

// startDNS starts egressd's network.resolver: A 127.0.0.1 for benchZone,
// NXDOMAIN elsewhere, never forwarding, so no DNS traffic leaves the machine.
func startDNS() (*dnsstub.Server, error) {
	s, err := dnsstub.New()
	if err != nil {
		return nil, err
	}
	s.SetZone(benchZone, func(int) []string { return []string{"A 127.0.0.1"} })
	return s, nil
}

// baseConfig is what every bench egressd's config has: listeners on
// 127.0.0.1:0, the DNS stub, interception where an entry injects, the bench CA
// for the upstream, the file backend.
func baseConfig(dnsAddr string) *egressdtest.Config {
	return &egressdtest.Config{
		Version:     1,
		Environment: envBench,
		Listeners:   []egressdtest.Listener{{Name: benchListener, Address: "127.0.0.1:0", Mode: "proxy", Role: "sandbox"}},
		Admin:       &egressdtest.Admin{Address: "127.0.0.1:0"},
		Network:     egressdtest.Network{Resolver: dnsAddr, UnsafeAllowCIDRs: []string{"127.0.0.0/8"}},
		TLS:         &egressdtest.TLS{Intercept: "auto", UpstreamCAFile: upstreamCAFile},
		Credentials: &egressdtest.Credentials{Backend: "file", File: credentialsFile},
		Log:         &egressdtest.Log{Level: "info", Format: "json"},
		StateDir:    stateDir,
	}
}

// benchConfig is the config of the first egressd (and of the vault path's and
// the hook-attack row's), with the files beside it: one entry per path's host,
// the hook's when its endpoint runs. vault, when set, replaces the file
// backend; maxConns is limits.max_connections.
func benchConfig(up *upstream, dnsAddr string, vault *egressdtest.Credentials, maxConns int) (*egressdtest.Config, map[string]string) {
	cfg := baseConfig(dnsAddr)
	files := map[string]string{upstreamCAFile: string(up.caPEM)}
	tlsPorts := []int{portNum(up.tlsAddr)}
	cfg.Policy.Allowlist = []egressdtest.Entry{
		{Domain: "localhost", Ports: []int{portNum(up.httpAddr), portNum(up.tlsAddr)}},
		{Domain: transformHost, Ports: tlsPorts, Transform: map[string]string{transformHeader: transformValue}},
		{Domain: credentialHost, Ports: tlsPorts, Credential: credentialID},
	}
	if vault != nil {
		cfg.Credentials = vault
	} else {
		cfg.Policy.Allowlist = append(cfg.Policy.Allowlist, egressdtest.Entry{Domain: oauthHost, Ports: tlsPorts, Credential: oauthCredentialID},
			egressdtest.Entry{Domain: githubHost, Ports: tlsPorts, Credential: githubCredentialID, GitHub: "git"})
		files[credentialsFile] = fmt.Sprintf("{%q: {\"token\": %q},\n %q: {\"type\": \"oauth2\", \"client_id\": \"bench\", \"client_secret\": \"bench-secret\", \"refresh_token\": \"bench-refresh\", \"token_url\": \"https://%s:%d%s\"},\n %q: %s}\n",
			credentialID, credentialToken, oauthCredentialID, credentialHost, portNum(up.tlsAddr), oauthTokenPath,
			githubCredentialID, githubSecret(up))
	}
	if up.hook != nil { // POST hookURLPath is the hook URL, hookOtherPath is not
		cfg.Policy.Allowlist = append(cfg.Policy.Allowlist, egressdtest.Entry{Domain: hookHost, Ports: []int{portNum(up.hook.addr)},
			Transform: map[string]string{transformHeader: transformValue}})
		cfg.Hooks = &egressdtest.Hooks{File: "hooks.json"}
		files["hooks.json"] = fmt.Sprintf(hooksJSON, up.hook.url(hookURLPath), hookTimeout)
	}
	cfg.Limits = &egressdtest.Limits{MaxConnections: maxConns}
	return cfg, files
}

// benchMaxConnections is egressd's limits.max_connections: above the most
// clients a run may have, since the bench measures the request path, not the limit.
const benchMaxConnections = 2 * maxClients

// portNum is the port of a host:port address (0 when it has none).
func portNum(addr string) int {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return 0
	}
	return int(ap.Port())
}

// githubSecret is the github_app credential of the github_app path: the upstream's App
// key, one repository, the upstream as its API. The upstream does not check the JWT
// (the tests' stand-in GitHub does): the bench measures what a request costs once the
// token is cached.
func githubSecret(up *upstream) string {
	b, _ := json.Marshal(map[string]any{"type": "github_app", "app_id": "1", "installation_id": "1",
		"private_key": up.appKey, "repositories": []string{"bench"},
		"api_url": fmt.Sprintf("https://%s:%d", credentialHost, portNum(up.tlsAddr))})
	return string(b)
}

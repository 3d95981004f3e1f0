package main

import (
	"fmt"
	"net/netip"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// The bench's egressd configs: the full request path (allowlist, address guard,
// interception and injection where an entry asks for it, one JSON log line per
// request at info, which is part of the cost) with loopback opened, since the
// upstream lives there. Listeners bind port 0. The intercepted entries are names
// in benchZone, which only the DNS stub (network.resolver) answers; localhost
// still comes from /etc/hosts.

const (
	// benchListener is the explicit listener every bench egressd has.
	benchListener = "bench"
	// stateDir is where egressd generates its CA on start.
	stateDir = "state"
	// upstreamCAFile holds the bench CA, which signed the upstream's leaf:
	// tls.upstream_ca_file.
	upstreamCAFile = "bench-ca.pem"
	// credentialsFile is the file backend's credentials.
	credentialsFile = "credentials.json"
)

// baseConfig is what every bench egressd's config has: the environment, the
// bench listener and the admin listener on 127.0.0.1:0, the DNS stub as
// resolver (it answers *.bench.test only and forwards nothing),
// unsafe_allow_cidrs 127.0.0.0/8 (the development and test switch that lets it
// dial the loopback upstream), interception where an entry injects, the bench
// CA for the upstream, the file backend and the JSON log at info.
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
// the hook-attack row's), with the files beside it. Its entries: localhost on
// the upstream's two ports (plain, connect: spliced, nothing injected), the
// transform host (intercept, intercept-newconn), the credential host
// (credential, vault) and, file-backed only, the oauth2 host; with the hook
// endpoint running, its host (hook, intercept-post) and hooks.json. vault, when
// set, is the credentials section instead of the file backend. maxConns is
// limits.max_connections: benchMaxConnections (above -idle-tunnels' most, so
// that path measures memory), or the attack row's, below its attackers.
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
		cfg.Policy.Allowlist = append(cfg.Policy.Allowlist, egressdtest.Entry{Domain: oauthHost, Ports: tlsPorts, Credential: oauthCredentialID})
		files[credentialsFile] = fmt.Sprintf("{%q: {\"token\": %q},\n %q: {\"type\": \"oauth2\", \"client_id\": \"bench\", \"client_secret\": \"bench-secret\", \"refresh_token\": \"bench-refresh\", \"token_url\": \"https://%s:%d%s\"}}\n",
			credentialID, credentialToken, oauthCredentialID, credentialHost, portNum(up.tlsAddr), oauthTokenPath)
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

// vaultCredentials is the credentials section of the vault path's egressd:
// the Vault dev server on 127.0.0.1, its root token in tokenFile (the bench
// measures the request path, not the login), and background reads only.
func vaultCredentials(addr, tokenFile string) *egressdtest.Credentials {
	return &egressdtest.Credentials{Backend: "vault", Vault: &egressdtest.Vault{
		Address: addr, Auth: egressdtest.VaultAuth{Method: "token", TokenFile: tokenFile},
		KVMount: "secret", KVPrefix: vaultKVPrefix, Refresh: vaultRefresh.String(),
	}}
}

// portNum is the port of a host:port address (0 when it has none).
func portNum(addr string) int {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return 0
	}
	return int(ap.Port())
}

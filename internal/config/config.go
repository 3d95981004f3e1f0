// Package config loads and validates egressd's operator config and policy;
// raw schema in, validated runtime types out.
//
// The YAML operator config (egressd.yaml) decodes into the raw types of
// raw.go, strictly: every unknown key, type mismatch and invalid value is
// reported at once, with its path and line, in one *ValidationError. Only a
// config without errors becomes a Config, whose fields hold parsed values
// (netip.AddrPort, time.Duration, resolved file paths) with every default
// applied, so the rest of egressd never re-checks them. The policy
// (environment.json, or policy.allowlist inline) is loaded and compiled in
// the same pass, so a Config and its policy are one snapshot: a reload
// swaps both or neither.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
)

// Values of Listener.Mode.
const (
	ModeProxy       = "proxy"       // explicit proxy: HTTP absolute-form and CONNECT
	ModeTransparent = "transparent" // REDIRECTed TCP: TLS by SNI, plain HTTP by Host
)

// Values of Listener.Role.
const (
	RoleSandbox = "sandbox" // the sandbox's traffic
	RoleHooks   = "hooks"   // traffic from this listener is hook traffic
)

// Values of Hooks.Identify: how the agent runtime's hook calls are told from the
// sandbox's (docs/hooks.md).
const (
	IdentifyListener    = "listener"     // only a role: hooks listener's traffic is hook traffic
	IdentifyRuntimeAuth = "runtime_auth" // traffic that presents hooks.runtime_auth as Proxy-Authorization
	IdentifyURL         = "url"          // any traffic to a hook URL: the sandbox can pose as the runtime
)

// Values of TLS.DenyInTunnel: how a refused CONNECT is answered.
const (
	DenyInTunnelAuto   = "auto"   // inside TLS wherever tls.intercept is not none
	DenyInTunnelAlways = "always" // inside TLS, whatever tls.intercept says
	DenyInTunnelNever  = "never"  // a plain 403 (or the refusal's status) instead of 200
)

// Values of DNS.RefusedNames: how the DNS guard answers A and AAAA queries for
// names the allowlist cannot allow.
const (
	RefusedNamesSinkhole = "sinkhole" // egressd's own address, so the client connects and reads the 403
	RefusedNamesRefuse   = "refuse"   // REFUSED, so the client reports a name that did not resolve
)

// Values of Credentials.Backend.
const (
	BackendFile  = "file"  // a JSON file of credential ID -> secret
	BackendVault = "vault" // HashiCorp Vault KV v2
)

// Values of VaultAuth.Method.
const (
	AuthToken      = "token"
	AuthAppRole    = "approle"
	AuthJWT        = "jwt"
	AuthKubernetes = "kubernetes"
)

// Values of Log.Level and Log.Format.
const (
	LevelDebug    = "debug"
	LevelInfo     = "info"
	LevelWarn     = "warn"
	LevelError    = "error"
	FormatJSON    = "json"
	FormatConsole = "console"
)

// Config is a validated operator config. Every field holds a checked value
// with its default applied; relative file paths have been resolved against
// the config file's directory.
type Config struct {
	Version     int
	Environment string // matches ^[A-Za-z0-9_.-]{1,64}$; default env_default
	Listeners   []Listener
	Admin       Admin
	Readiness   Readiness
	Policy      PolicySource
	Network     Network
	DNS         DNS
	TLS         TLS
	Credentials Credentials
	Hooks       Hooks
	Limits      Limits
	Log         Log
	StateDir    string
	// Node is node mode (node:); its zero value is a sidecar.
	Node Node
	// Rules is the policy named by Policy, loaded and compiled with
	// AllowlistOptions. Set by Parse, Load and LoadDefault; nil from Default.
	Rules *Policy
	// Warnings are the non-fatal problems of the config and its policy.
	Warnings []Problem
	// Hash is the lowercase hex SHA-256 of the config file's bytes followed
	// by the policy file's bytes (`cat egressd.yaml environment.json |
	// sha256sum`); an inline policy adds nothing. Shown by /healthz.
	Hash string
	// raw is what the file said, before defaults: a sandbox spec is validated as
	// this config with the spec's sections in place (ParseSandbox).
	raw     *rawConfig
	baseDir string // where raw's relative paths resolve
}

// Node is node mode: one egressd serving every sandbox on a machine, each
// registered at runtime through SandboxesDir or APISocket (docs/node.md).
type Node struct {
	SandboxesDir string // one <id>.json|yaml per sandbox, watched; "" for none
	APISocket    string // the registration API's Unix socket; "" for none
	MaxSandboxes int    // registered at once; default DefaultMaxSandboxes
}

// Enabled reports whether the config is a node's.
func (n Node) Enabled() bool { return n.SandboxesDir != "" || n.APISocket != "" }

// Listener is one address egressd serves the sandbox (or its hooks) on.
type Listener struct {
	Name    string         // unique; appears in logs and metrics
	Address netip.AddrPort // an IP literal; port 0 picks a free port (tests)
	Mode    string         // ModeProxy (default) or ModeTransparent
	Role    string         // RoleSandbox (default) or RoleHooks
	// Redirect says where a transparent listener's REDIRECT runs: RedirectLocal
	// (the same network namespace, a sidecar: loopback is the right address),
	// RedirectGateway (a DNAT from the sandbox's own namespace: never loopback),
	// or "" (unsaid: a loopback address is then warned about).
	Redirect string
	// PeerUIDs, when set, admits only connections whose process runs as one of
	// these users (read from the kernel's socket table: a loopback listener's
	// peers are this host's processes); the others are closed at accept. A node's
	// sandbox and its agent runtime share a namespace: this is how a role: hooks
	// listener there is the runtime's alone.
	PeerUIDs []uint32
}

// Equal reports whether l and o are the same listener, every field equal.
func (l Listener) Equal(o Listener) bool {
	return l.Name == o.Name && l.Address == o.Address && l.Mode == o.Mode && l.Role == o.Role &&
		l.Redirect == o.Redirect && slices.Equal(l.PeerUIDs, o.PeerUIDs)
}

// Values of Listener.Redirect.
const (
	RedirectLocal   = "local"   // iptables OUTPUT in egressd's own namespace (a pod sidecar)
	RedirectGateway = "gateway" // DNAT on the host side of the sandbox's veth (deploy/netns)
)

// Admin is the admin listener (explain, reload, sandbox env, CA, JWKS, and
// health unless HealthAddress or HealthSocket is set) and the health listener
// (/healthz, /readyz, /metrics only).
type Admin struct {
	// Address is the admin listener's TCP address: loopback unless Exposed with a
	// Token. Invalid (the zero AddrPort) when the admin listener is off
	// (admin.address: "") or a Unix socket. It never equals a listener's address.
	Address netip.AddrPort
	// Socket is the admin listener's Unix socket path (admin.address:
	// unix:///path), created 0600; "" when Address is used or the listener is off.
	Socket string
	// HealthAddress and HealthSocket are the health listener (admin.health_address,
	// host:port or unix:///path): what probes and Prometheus reach, so it may be
	// routable. Both empty: health is served on the admin listener.
	HealthAddress netip.AddrPort
	HealthSocket  string
	// Exposed (admin.exposed) says a routable Address is on purpose; it needs
	// Token, which every request to the admin listener must then present.
	Exposed bool
	// Token (admin.token) is the Bearer token every request to the admin
	// listener must carry, when set: a credential whose token it is, or a file.
	Token SecretRef
	// Pprof serves net/http/pprof under /debug/pprof/ on the admin listener
	// (admin.pprof, default false). Profiles show request paths and timing, not
	// secrets, but a CPU profile costs CPU while it runs: leave it off unless
	// profiling.
	Pprof bool
}

// Enabled reports whether the admin listener should be served.
func (a Admin) Enabled() bool { return a.Address.IsValid() || a.Socket != "" }

// SeparateHealth reports whether health is served on its own listener.
func (a Admin) SeparateHealth() bool { return a.HealthAddress.IsValid() || a.HealthSocket != "" }

// Readiness shapes what /readyz waits for.
type Readiness struct {
	// RequireCredentials makes /readyz wait until every credential can be
	// served; false (the default): ready once the policy is loaded and the
	// listeners serve, each credential's state reported beside.
	RequireCredentials bool
}

// PolicySource says where the policy comes from: exactly one of File (a
// JSON environment, resolved path) and Inline (policy.allowlist).
type PolicySource struct {
	File   string
	Inline []allowlist.Entry
}

// Network shapes how egressd reaches upstreams.
type Network struct {
	// Resolver is the DNS server egressd uses, as ip:port; "" means the
	// system resolver.
	Resolver string
	// AllowCIDRs opens private, CGNAT and reserved ranges; never loopback,
	// link-local, metadata and the other always-denied classes.
	AllowCIDRs []netip.Prefix
	// UnsafeAllowCIDRs may open anything but egressd's own addresses. For
	// development and tests; a non-empty list is a warning.
	UnsafeAllowCIDRs []netip.Prefix
	// DefaultPorts are allowed for entries without ports; default 80, 443.
	DefaultPorts []uint16
}

// DNS is the optional DNS guard for transparent mode.
type DNS struct {
	Listen string // ip:port, or "" for no DNS guard
	// RefusedNames is RefusedNamesSinkhole (default) or RefusedNamesRefuse.
	RefusedNames string
	// The guard's TCP bounds: connections open at once in total and per client
	// IP (more are closed at once), how long a connection may sit between
	// queries, and how many queries one connection may carry.
	MaxTCPConnections int
	MaxTCPPerClient   int
	TCPIdle           time.Duration
	TCPMaxQueries     int
}

// TLS configures interception and upstream verification.
type TLS struct {
	Intercept allowlist.InterceptMode // allowlist.InterceptAuto (default), InterceptAll or InterceptNone
	// CACert and CAKey are PEM files, both set or both empty; when empty the
	// CA is generated into StateDir.
	CACert, CAKey string
	// UpstreamCAFile adds roots for verifying upstreams (private PKI, tests).
	UpstreamCAFile string
	// CAPublicDir holds the CA's public files every user may read (the CA
	// certificate, the merged bundle, the PKCS#12 trust store); default
	// <state_dir>/ca (DefaultCAPublicDir).
	CAPublicDir string
	// DenyInTunnel is DenyInTunnelAuto (default), DenyInTunnelAlways or
	// DenyInTunnelNever; DenyInside says what it means for this config.
	DenyInTunnel string
}

// DenyInside reports whether a refused CONNECT is answered inside TLS: 200,
// a handshake with egressd's leaf for the requested name, then the refusal to
// the first request, so clients that hide a CONNECT's status show the reason.
// Under auto that is wherever egressd intercepts at all, since the sandbox
// then trusts egressd's CA.
func (t TLS) DenyInside() bool {
	switch t.DenyInTunnel {
	case DenyInTunnelAlways:
		return true
	case DenyInTunnelNever:
		return false
	default:
		return t.Intercept != allowlist.InterceptNone
	}
}

// Credentials configures where credential IDs are resolved.
type Credentials struct {
	Backend string // BackendFile (default) or BackendVault
	File    string // the JSON file of the file backend; required for it
	// MaxStale bounds how old a cached secret may be once the backend stops
	// answering; past it requests fail closed. Default 5m.
	MaxStale time.Duration
	Vault    Vault
}

// Vault configures the vault backend. An empty Address means VAULT_ADDR
// (validation requires one or the other when the backend is vault).
type Vault struct {
	Address  string
	Auth     VaultAuth
	KVMount  string        // default "secret"
	KVPrefix string        // default "egressd/credentials"
	Refresh  time.Duration // default 30s, jittered by the backend
	// Paths are credentials read from any Vault path instead of KV
	// (credentials.vault.paths), sorted by ID.
	Paths []VaultPath
}

// VaultPath is one credential read from a Vault path other than KV, such
// as a Vault identity token (identity/oidc/token/<role>) or a leased
// secret: one string field of the response's data becomes one header.
type VaultPath struct {
	ID     string // the credential ID, as the policy names it
	Path   string // the API path without /v1/, no leading or trailing "/"
	Field  string // the data key holding the value; default "token"
	Header string // canonical header name; default Authorization
	// Format is the header value with "{}" (exactly once) standing for the
	// field's value; default "Bearer {}".
	Format string
}

// VaultAuth is how egressd logs in to Vault. Token may hold a secret (when
// the operator put one in the file, which validation warns about); String,
// GoString and MarshalJSON redact it.
type VaultAuth struct {
	Method       string // AuthToken (default), AuthAppRole, AuthJWT or AuthKubernetes
	Token        string // token: the token itself; prefer TokenFile or VAULT_TOKEN
	TokenFile    string // token: a file holding the token
	RoleIDFile   string // approle
	SecretIDFile string // approle
	Role         string // jwt, kubernetes
	JWTFile      string // jwt; kubernetes (default: the service account token)
	Mount        string // the auth mount path; default: the method's name
}

// redacted returns a copy safe to print.
func (a VaultAuth) redacted() vaultAuthView {
	if a.Token != "" {
		a.Token = "[redacted]"
	}
	return vaultAuthView(a)
}

// vaultAuthView has VaultAuth's fields and none of its methods, so
// printing it does not recurse.
type vaultAuthView VaultAuth

// String prints the fields with Token redacted.
func (a VaultAuth) String() string { return fmt.Sprintf("%+v", a.redacted()) }

// GoString prints the fields with Token redacted.
func (a VaultAuth) GoString() string { return fmt.Sprintf("%#v", a.redacted()) }

// MarshalJSON encodes the fields with Token redacted.
func (a VaultAuth) MarshalJSON() ([]byte, error) { return json.Marshal(a.redacted()) }

// Hooks configures hook traffic.
type Hooks struct {
	// File is hooks.json; "" means the policy's inline .agents/hooks.json
	// (Config.Rules.HooksJSON).
	File string
	// FailClosed turns every failed pre_tool_execution call into a deny.
	// Default true.
	FailClosed bool
	SigningKey SecretRef
	// Identify is how the runtime's hook calls are told from the sandbox's:
	// IdentifyListener (the default), IdentifyRuntimeAuth (the default when
	// RuntimeAuth is set) or IdentifyURL.
	Identify string
	// RuntimeAuth names the token the runtime presents as Proxy-Authorization
	// (identify runtime_auth); the sandbox must never hold it.
	RuntimeAuth SecretRef
}

// SecretRef names a secret by credential ID or file: exactly one, or
// neither (then egressd generates the key into StateDir).
type SecretRef struct {
	Credential string
	File       string
}

// MemoryAuto is limits.memory's spelling of auto (Limits.Memory 0).
const MemoryAuto = "auto"

// Limits bound each way a client or upstream can hold a resource. All
// positive.
type Limits struct {
	ReadHeader     time.Duration // client must send its request head within this
	Dial           time.Duration // one upstream connect
	DNS            time.Duration // one resolution
	ResponseHeader time.Duration // upstream must answer within this (504)
	ClientIdle     time.Duration // idle keep-alive client connections are closed
	TunnelIdle     time.Duration // a tunnel with no bytes either way is closed
	StreamIdle     time.Duration // a forwarded stream or upgraded connection with no bytes either way ends
	UpstreamIdle   time.Duration // idle keep-alive upstream connections are closed
	MaxHeaderBytes int           // larger request heads get 431
	MaxConnections int           // per listener; beyond it 503
	HookBodyBytes  int64         // larger hook bodies are a hook failure
	LeafMints      int           // interception leaves minted at once; more queue
	// HookBufferBytes bounds every hook body buffered at once, process-wide; past
	// it a pre-tool call gets the fail-closed deny, anything else 503 overloaded.
	HookBufferBytes int64
	ClientWrite     time.Duration // a client that reads nothing for this long is closed
	Drain           time.Duration // SIGTERM: in-flight work gets this long, then exit
	// Memory is the one budget of everything a client can make egressd hold, in
	// bytes; 0 is auto (a share of the memory limit egressd can see, resolved at
	// start and on reload: internal/membudget).
	Memory int64
}

// Log configures the logger.
type Log struct {
	Level  string // LevelDebug, LevelInfo (default), LevelWarn or LevelError
	Format string // FormatJSON (default) or FormatConsole
}

// AllowlistOptions are the options the policy is compiled with.
func (c *Config) AllowlistOptions() allowlist.Options {
	return allowlist.Options{
		DefaultPorts: c.Network.DefaultPorts,
		Intercept:    c.TLS.Intercept,
	}
}

// Load reads and validates the config file at path and the policy it
// names. Relative paths in it resolve against its directory. A read
// failure of the config file itself is a plain error; everything about its
// content is a *ValidationError.
func Load(path string) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	data, err := readFile(abs)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, filepath.Dir(abs))
}

// Parse validates config bytes and loads the policy they name; relative
// paths resolve against baseDir ("" leaves them relative to the working
// directory). Every error it returns is a *ValidationError.
func Parse(data []byte, baseDir string) (*Config, error) {
	ps := newProblems()
	raw, ok := decodeConfig(data, ps)
	if !ok {
		return nil, ps.err()
	}
	cfg := validate(raw, baseDir, ps)
	policyBytes := cfg.loadPolicy(raw.Policy.Allowlist, ps)
	if err := ps.err(); err != nil {
		return nil, err
	}
	cfg.Warnings = ps.warnings()
	cfg.Hash = hashOf(data, policyBytes)
	cfg.raw, cfg.baseDir = raw, baseDir
	return cfg, nil
}

// Default returns the quick-start config that `egressd run` uses without
// --config: listener "sandbox" on 127.0.0.1:15001 (proxy, sandbox), admin
// on 127.0.0.1:15000, policy configs/environment.json and the file backend
// with configs/credentials.json (both relative to the working directory),
// state in .egressd, and every other default. Its policy is not loaded
// (Rules is nil, Hash empty): LoadDefault loads it.
func Default() *Config {
	ps := newProblems()
	cfg := validate(defaultRaw(), "", ps)
	if ps.count() > 0 {
		panic("config: the default config is invalid: " + ps.err().Error())
	}
	return cfg
}

// LoadDefault returns Default with its policy loaded from the working
// directory. Its Hash covers the policy file's bytes alone.
func LoadDefault() (*Config, error) {
	return loadDefault(defaultRaw())
}

// LoadDefaultFiles is LoadDefault with the quick-start policy and credentials
// read from the given files instead of configs/ in the working directory.
func LoadDefaultFiles(policyFile, credentialsFile string) (*Config, error) {
	r := defaultRaw()
	r.Policy.File, r.Credentials.File = policyFile, credentialsFile
	return loadDefault(r)
}

func loadDefault(r *rawConfig) (*Config, error) {
	ps := newProblems()
	cfg := validate(r, "", ps)
	if err := ps.err(); err != nil {
		return nil, err
	}
	policyBytes := cfg.loadPolicy(nil, ps)
	if err := ps.err(); err != nil {
		return nil, err
	}
	cfg.Warnings = ps.warnings()
	cfg.Hash = hashOf(nil, policyBytes)
	return cfg, nil
}

// defaultRaw is the quick-start config before defaults: only what has no
// default of its own.
func defaultRaw() *rawConfig {
	version := 1
	return &rawConfig{
		Version:     &version,
		Listeners:   []rawListener{{Name: DefaultListenerName, Address: DefaultListenerAddress}},
		Policy:      rawPolicy{File: DefaultPolicyFile},
		Credentials: rawCredentials{File: DefaultCredentialsFile},
	}
}

// loadPolicy loads the policy file, or compiles the inline allowlist, into
// c.Rules, recording problems in ps. It returns the policy file's bytes
// (nil for an inline policy) for the hash.
func (c *Config) loadPolicy(inline *rawAllowlist, ps *problems) []byte {
	opts := c.AllowlistOptions()
	if inline != nil {
		p := &Policy{}
		p.Allowlist, p.Entries = compileAllowlist(inline, "policy.allowlist", opts, ps)
		c.Policy.Inline, c.Rules = p.Entries, p
		return nil
	}
	if c.Policy.File == "" {
		if c.Node.Enabled() {
			// A node without a policy of its own serves only its sandboxes: its own
			// listeners, if any, refuse everything.
			c.Rules = &Policy{Disabled: true}
			c.Rules.Allowlist, c.Rules.Entries = compileAllowlist(&rawAllowlist{disabled: true}, "policy", opts, ps)
		}
		return nil // else reported by validate
	}
	data, err := readFile(c.Policy.File)
	if err != nil {
		ps.errorf("policy.file", "cannot read the policy: %v", err)
		return nil
	}
	p, pps := readPolicy(data, c.Policy.File, opts)
	ps.merge(pps)
	c.Rules = p
	return data
}

// hashOf is the hex SHA-256 of the concatenated parts.
func hashOf(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

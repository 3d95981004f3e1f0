package egressdtest

import (
	"gopkg.in/yaml.v3"
)

// Config is egressd.yaml as the suites write it: the keys of
// docs/configuration.md, each omitted when empty so that egressd applies its default. It is a
// separate type from internal/config's raw schema, whose types are unexported and
// made for decoding (positions, durations parsed in place, nil meaning "missing");
// TestConfigKeysKnown keeps the two in step by loading a Config with every key set.
// Durations are strings, so a test can write a bad one on purpose.
type Config struct {
	Version     int          `yaml:"version"`
	Environment string       `yaml:"environment,omitempty"`
	Listeners   []Listener   `yaml:"listeners,omitempty"`
	Admin       *Admin       `yaml:"admin,omitempty"`
	Readiness   *Readiness   `yaml:"readiness,omitempty"`
	Policy      Policy       `yaml:"policy,omitempty"`
	Network     Network      `yaml:"network,omitempty"`
	DNS         *DNS         `yaml:"dns,omitempty"`
	TLS         *TLS         `yaml:"tls,omitempty"`
	Credentials *Credentials `yaml:"credentials,omitempty"`
	Hooks       *Hooks       `yaml:"hooks,omitempty"`
	Limits      *Limits      `yaml:"limits,omitempty"`
	Log         *Log         `yaml:"log,omitempty"`
	StateDir    string       `yaml:"state_dir,omitempty"`
	Node        *Node        `yaml:"node,omitempty"`
}

// Listener is one listeners[] item.
type Listener struct {
	Name     string   `yaml:"name"`
	Address  string   `yaml:"address"`
	Mode     string   `yaml:"mode,omitempty"`
	Role     string   `yaml:"role,omitempty"`
	Redirect string   `yaml:"redirect,omitempty"`
	PeerUIDs []uint32 `yaml:"peer_uids,omitempty"`
}

// Admin is the admin listener. Address "" leaves egressd's default.
type Admin struct {
	Address       string     `yaml:"address,omitempty"`
	HealthAddress string     `yaml:"health_address,omitempty"`
	Pprof         bool       `yaml:"pprof,omitempty"`
	Exposed       bool       `yaml:"exposed,omitempty"`
	Token         *SecretRef `yaml:"token,omitempty"`
}

// Readiness is what /readyz waits for.
type Readiness struct {
	RequireCredentials bool `yaml:"require_credentials,omitempty"`
}

// Policy is the allowlist, inline or in a policy file.
type Policy struct {
	File      string  `yaml:"file,omitempty"`
	Allowlist []Entry `yaml:"allowlist,omitempty"`
}

// Entry is one allowlist entry.
type Entry struct {
	Domain         string            `yaml:"domain"`
	Ports          []int             `yaml:"ports,omitempty,flow"`
	Transform      map[string]string `yaml:"transform,omitempty"`
	Credential     string            `yaml:"credential,omitempty"`
	AllowPlaintext bool              `yaml:"allow_plaintext,omitempty"`
	GitHub         string            `yaml:"github,omitempty"`
	AWS            *AWSScope         `yaml:"aws,omitempty"`
}

// Network is the resolver and the address guard's exceptions.
type Network struct {
	Resolver         string   `yaml:"resolver,omitempty"`
	AllowCIDRs       []string `yaml:"allow_cidrs,omitempty,flow"`
	UnsafeAllowCIDRs []string `yaml:"unsafe_allow_cidrs,omitempty,flow"`
	DefaultPorts     []int    `yaml:"default_ports,omitempty,flow"`
}

// DNS is the DNS guard.
type DNS struct {
	Listen            string `yaml:"listen,omitempty"`
	RefusedNames      string `yaml:"refused_names,omitempty"`
	MaxTCPConnections int    `yaml:"max_tcp_connections,omitempty"`
	MaxTCPPerClient   int    `yaml:"max_tcp_per_client,omitempty"`
	TCPIdle           string `yaml:"tcp_idle,omitempty"`
	TCPMaxQueries     int    `yaml:"tcp_max_queries,omitempty"`
}

// TLS is interception and the upstream trust.
type TLS struct {
	Intercept      string `yaml:"intercept,omitempty"`
	CACert         string `yaml:"ca_cert,omitempty"`
	CAKey          string `yaml:"ca_key,omitempty"`
	UpstreamCAFile string `yaml:"upstream_ca_file,omitempty"`
	CAPublicDir    string `yaml:"ca_public_dir,omitempty"`
	DenyInTunnel   string `yaml:"deny_in_tunnel,omitempty"`
}

// Credentials is the credential backend.
type Credentials struct {
	Backend  string `yaml:"backend,omitempty"`
	File     string `yaml:"file,omitempty"`
	MaxStale string `yaml:"max_stale,omitempty"`
	Vault    *Vault `yaml:"vault,omitempty"`
}

// Vault is credentials.vault.
type Vault struct {
	Address  string               `yaml:"address,omitempty"`
	Auth     VaultAuth            `yaml:"auth,omitempty"`
	KVMount  string               `yaml:"kv_mount,omitempty"`
	KVPrefix string               `yaml:"kv_prefix,omitempty"`
	Refresh  string               `yaml:"refresh,omitempty"`
	Paths    map[string]VaultPath `yaml:"paths,omitempty"`
}

// VaultPath is one credentials.vault.paths item.
type VaultPath struct {
	Path   string  `yaml:"path"`
	Field  string  `yaml:"field,omitempty"`
	Header string  `yaml:"header,omitempty"`
	Format *string `yaml:"format,omitempty"`
}

// VaultAuth is credentials.vault.auth.
type VaultAuth struct {
	Method       string `yaml:"method,omitempty"`
	Token        string `yaml:"token,omitempty"`
	TokenFile    string `yaml:"token_file,omitempty"`
	RoleIDFile   string `yaml:"role_id_file,omitempty"`
	SecretIDFile string `yaml:"secret_id_file,omitempty"`
	Role         string `yaml:"role,omitempty"`
	JWTFile      string `yaml:"jwt_file,omitempty"`
	Mount        string `yaml:"mount,omitempty"`
}

// Hooks is the hooks file, its signing key and how hook calls are identified.
type Hooks struct {
	File        string     `yaml:"file,omitempty"`
	FailClosed  *bool      `yaml:"fail_closed,omitempty"`
	SigningKey  *SecretRef `yaml:"signing_key,omitempty"`
	Identify    string     `yaml:"identify,omitempty"`
	RuntimeAuth *SecretRef `yaml:"runtime_auth,omitempty"`
}

// SecretRef names a secret by credential ID or file.
type SecretRef struct {
	Credential string `yaml:"credential,omitempty"`
	File       string `yaml:"file,omitempty"`
}

// Limits are the timeouts and bounds; zero values are omitted.
type Limits struct {
	ReadHeader     string `yaml:"read_header,omitempty"`
	MaxHeaderBytes int    `yaml:"max_header_bytes,omitempty"`
	Dial           string `yaml:"dial,omitempty"`
	DNS            string `yaml:"dns,omitempty"`
	ResponseHeader string `yaml:"response_header,omitempty"`
	ClientIdle     string `yaml:"client_idle,omitempty"`
	TunnelIdle     string `yaml:"tunnel_idle,omitempty"`
	StreamIdle     string `yaml:"stream_idle,omitempty"`
	UpstreamIdle   string `yaml:"upstream_idle,omitempty"`
	MaxConnections int    `yaml:"max_connections,omitempty"`
	HookBodyBytes  int64  `yaml:"hook_body_bytes,omitempty"`
	LeafMints      int    `yaml:"leaf_mints,omitempty"`
	HookBuffer     int64  `yaml:"hook_buffer_bytes,omitempty"`
	ClientWrite    string `yaml:"client_write,omitempty"`
	Drain          string `yaml:"drain,omitempty"`
	Memory         string `yaml:"memory,omitempty"` // "auto" or a size such as "64MiB"
}

// Log is the logger: the suites read JSON.
type Log struct {
	Level  string `yaml:"level,omitempty"`
	Format string `yaml:"format,omitempty"`
}

// YAML renders c as egressd.yaml.
func (c *Config) YAML() ([]byte, error) { return yaml.Marshal(c) }

// AWSScope is an entry's aws block.
type AWSScope struct {
	Regions  []string `yaml:"regions,flow"`
	Services []string `yaml:"services,flow"`
}

// Node is the node section (node mode).
type Node struct {
	SandboxesDir string `yaml:"sandboxes_dir,omitempty"`
	APISocket    string `yaml:"api_socket,omitempty"`
	MaxSandboxes int    `yaml:"max_sandboxes,omitempty"`
}

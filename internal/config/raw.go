package config

import (
	"time"

	"github.com/docker/go-units"
	"gopkg.in/yaml.v3"
)

// The raw schema: what egressd.yaml may say, key for key as
// docs/configuration.md lists it. Nothing here is validated; validate.go turns
// a rawConfig into a Config. Pointers mark keys whose absence means "use the
// default" where the zero value is meaningful (admin.address "" turns the
// admin listener off; fail_closed false opens hooks). The yaml tags are the
// contract: strict.go reports every key that matches no tag.

type rawConfig struct {
	Version     *int           `yaml:"version"`
	Environment string         `yaml:"environment"`
	Listeners   []rawListener  `yaml:"listeners"`
	Admin       rawAdmin       `yaml:"admin"`
	Readiness   rawReadiness   `yaml:"readiness"`
	Policy      rawPolicy      `yaml:"policy"`
	Network     rawNetwork     `yaml:"network"`
	DNS         rawDNS         `yaml:"dns"`
	TLS         rawTLS         `yaml:"tls"`
	Credentials rawCredentials `yaml:"credentials"`
	Hooks       rawHooks       `yaml:"hooks"`
	Limits      rawLimits      `yaml:"limits"`
	Log         rawLog         `yaml:"log"`
	StateDir    string         `yaml:"state_dir"`
	Node        *rawNode       `yaml:"node"` // nil: a sidecar
}

// rawNode is node mode: the sandboxes are registered at runtime, not configured.
type rawNode struct {
	SandboxesDir string `yaml:"sandboxes_dir"`
	APISocket    string `yaml:"api_socket"`
	MaxSandboxes *int   `yaml:"max_sandboxes"`
}

type rawListener struct {
	Name     string   `yaml:"name"`
	Address  string   `yaml:"address"`
	Mode     string   `yaml:"mode"`
	Role     string   `yaml:"role"`
	Redirect string   `yaml:"redirect"`
	PeerUIDs []uint32 `yaml:"peer_uids"`
}

type rawAdmin struct {
	Address       *string      `yaml:"address"`        // nil: default; "": off
	HealthAddress string       `yaml:"health_address"` // "": health stays on the admin listener
	Pprof         bool         `yaml:"pprof"`
	Exposed       bool         `yaml:"exposed"`
	Token         rawSecretRef `yaml:"token"` // {credential: ID} or {file: path}
}

type rawReadiness struct {
	RequireCredentials bool `yaml:"require_credentials"`
}

// rawPolicy is policy.file or an inline policy.allowlist.
type rawPolicy struct {
	File      string        `yaml:"file"`
	Allowlist *rawAllowlist `yaml:"allowlist"`
}

type rawNetwork struct {
	Resolver         string   `yaml:"resolver"`
	AllowCIDRs       []string `yaml:"allow_cidrs"`
	UnsafeAllowCIDRs []string `yaml:"unsafe_allow_cidrs"`
	DefaultPorts     []int    `yaml:"default_ports"` // nil: default; []: an error
}

type rawDNS struct {
	Listen            string      `yaml:"listen"`
	RefusedNames      string      `yaml:"refused_names"`
	MaxTCPConnections *int        `yaml:"max_tcp_connections"`
	MaxTCPPerClient   *int        `yaml:"max_tcp_per_client"`
	TCPIdle           rawDuration `yaml:"tcp_idle"`
	TCPMaxQueries     *int        `yaml:"tcp_max_queries"`
}

type rawTLS struct {
	Intercept      string `yaml:"intercept"`
	CACert         string `yaml:"ca_cert"`
	CAKey          string `yaml:"ca_key"`
	UpstreamCAFile string `yaml:"upstream_ca_file"`
	CAPublicDir    string `yaml:"ca_public_dir"`
	DenyInTunnel   string `yaml:"deny_in_tunnel"`
}

type rawCredentials struct {
	Backend  string      `yaml:"backend"`
	File     string      `yaml:"file"`
	MaxStale rawDuration `yaml:"max_stale"`
	Vault    rawVault    `yaml:"vault"`
}

type rawVault struct {
	Address  string        `yaml:"address"`
	Auth     rawVaultAuth  `yaml:"auth"`
	KVMount  string        `yaml:"kv_mount"`
	KVPrefix string        `yaml:"kv_prefix"`
	Refresh  rawDuration   `yaml:"refresh"`
	Paths    rawVaultPaths `yaml:"paths"`
}

type rawVaultAuth struct {
	Method       string `yaml:"method"`
	Token        string `yaml:"token"`
	TokenFile    string `yaml:"token_file"`
	RoleIDFile   string `yaml:"role_id_file"`
	SecretIDFile string `yaml:"secret_id_file"`
	Role         string `yaml:"role"`
	JWTFile      string `yaml:"jwt_file"`
	Mount        string `yaml:"mount"`
}

type rawHooks struct {
	File        string       `yaml:"file"`
	FailClosed  *bool        `yaml:"fail_closed"` // nil: true
	SigningKey  rawSecretRef `yaml:"signing_key"`
	Identify    string       `yaml:"identify"`     // "": runtime_auth when RuntimeAuth is set, else listener
	RuntimeAuth rawSecretRef `yaml:"runtime_auth"` // {credential: ID} or {file: path}
}

type rawSecretRef struct {
	Credential string `yaml:"credential"`
	File       string `yaml:"file"`
}

type rawLimits struct {
	ReadHeader     rawDuration `yaml:"read_header"`
	MaxHeaderBytes *int        `yaml:"max_header_bytes"`
	Dial           rawDuration `yaml:"dial"`
	DNS            rawDuration `yaml:"dns"`
	ResponseHeader rawDuration `yaml:"response_header"`
	ClientIdle     rawDuration `yaml:"client_idle"`
	TunnelIdle     rawDuration `yaml:"tunnel_idle"`
	StreamIdle     rawDuration `yaml:"stream_idle"`
	UpstreamIdle   rawDuration `yaml:"upstream_idle"`
	MaxConnections *int        `yaml:"max_connections"`
	HookBodyBytes  *int64      `yaml:"hook_body_bytes"`
	LeafMints      *int        `yaml:"leaf_mints"`
	HookBuffer     *int64      `yaml:"hook_buffer_bytes"`
	ClientWrite    rawDuration `yaml:"client_write"`
	Drain          rawDuration `yaml:"drain"`
	Memory         rawByteSize `yaml:"memory"`
}

// rawByteSize is limits.memory: "auto", or a size in bytes ("192MiB", "1g",
// 201326592; units are binary, as docker's --memory reads them), parsed as it is
// decoded so that a bad one is reported on its line. set with n == 0 is auto.
type rawByteSize struct {
	set bool
	n   int64
}

func (r *rawByteSize) decodeNode(d *decoder, n *yaml.Node, path string) {
	s, ok := d.scalar(n, path, `"auto" or a size such as "192MiB"`)
	if !ok {
		return
	}
	if s == MemoryAuto {
		r.set = true
		return
	}
	v, err := units.RAMInBytes(s)
	if err != nil || v <= 0 {
		d.errorAt(path, n.Line, `invalid size %s: use "auto" or a number of bytes with an optional unit, such as "192MiB" or "1GiB"`, quoteShort(s))
		return
	}
	r.set, r.n = true, v
}

type rawLog struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// rawEntry is one allowlist entry, in the policy JSON or inline in YAML.
type rawEntry struct {
	Domain         *string      `yaml:"domain"` // nil: missing (an error)
	Ports          []int        `yaml:"ports"`
	Transform      rawTransform `yaml:"transform"`
	Credential     string       `yaml:"credential"`
	AllowPlaintext bool         `yaml:"allow_plaintext"`
	GitHub         string       `yaml:"github"` // "api" | "git": how a github_app token is sent
	AWS            *rawAWSScope `yaml:"aws"`
}

// rawAWSScope is an entry's "aws" block.
type rawAWSScope struct {
	Regions  []string `yaml:"regions"`
	Services []string `yaml:"services"`
}

// rawDuration is a Go duration string ("10s", "5m"), parsed as it is
// decoded so that a bad one is reported on its line.
type rawDuration struct {
	set bool
	d   time.Duration
}

func (r *rawDuration) decodeNode(d *decoder, n *yaml.Node, path string) {
	s, ok := d.scalar(n, path, `a duration such as "10s"`)
	if !ok {
		return
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.errorAt(path, n.Line, `invalid duration %s: use a number with a unit, such as "10s", "5m" or "1h"`, quoteShort(s))
		return
	}
	r.set, r.d = true, v
}

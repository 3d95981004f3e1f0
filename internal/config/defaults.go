package config

import (
	"time"

	"github.com/egressd/egressd/internal/allowlist"
)

// Defaults applied when a key is absent. Each matches docs/configuration.md;
// change both together.
const (
	// DefaultEnvironment names the environment in logs, metrics and hook
	// assertions when the config does not.
	DefaultEnvironment = "env_default"

	// DefaultMaxSandboxes bounds the sandboxes a node serves at once: each holds
	// listeners, a Snapshot and a credential store.
	DefaultMaxSandboxes = 2000
	// DefaultAPISocket is the example node.api_socket of messages.
	DefaultAPISocket = "/run/egressd/node.sock"

	// DefaultListenerName, DefaultListenerAddress, DefaultMode and
	// DefaultRole describe the one listener of the quick-start config:
	// an explicit proxy for the sandbox on loopback (HTTP_PROXY=http://127.0.0.1:15001).
	DefaultListenerName    = "sandbox"
	DefaultListenerAddress = "127.0.0.1:15001"
	DefaultMode            = ModeProxy
	DefaultRole            = RoleSandbox

	// DefaultAdminAddress is the admin listener (health, metrics, explain,
	// reload, CA, JWKS). Loopback only: the sandbox must never reach it.
	DefaultAdminAddress = "127.0.0.1:15000"
	// DefaultHealthExample is the example an invalid admin.health_address is
	// shown (the key has no default: health stays on the admin listener).
	DefaultHealthExample = "0.0.0.0:8081"
	// UnixPrefix marks an admin or health address that is a Unix socket's path.
	UnixPrefix = "unix://"

	// DefaultPolicyFile and DefaultCredentialsFile are the quick-start
	// files, relative to the working directory (Default) or to the config
	// file's directory (Parse, Load).
	DefaultPolicyFile      = "configs/environment.json"
	DefaultCredentialsFile = "configs/credentials.json"

	// DefaultIntercept terminates TLS only where egressd must see the
	// request: entries with a transform or credential, and hook URLs.
	DefaultIntercept = allowlist.InterceptAuto

	// DefaultDenyInTunnel answers a refused CONNECT inside TLS wherever
	// egressd intercepts, so the agent reads the reason (docs/reasons.md).
	DefaultDenyInTunnel = DenyInTunnelAuto

	// DefaultBackend keeps secrets in a local JSON file (the embedded default).
	DefaultBackend = BackendFile

	// DefaultMaxStale bounds how old a cached secret may be once its backend
	// stops answering; past it, requests fail closed (credential_unavailable).
	DefaultMaxStale = 5 * time.Minute

	// DefaultVaultAuthMethod authenticates with a Vault token (token,
	// token_file or VAULT_TOKEN).
	DefaultVaultAuthMethod = AuthToken
	// DefaultVaultKVMount and DefaultVaultKVPrefix place credential "x" at
	// secret/data/egressd/credentials/x (KV v2).
	DefaultVaultKVMount  = "secret"
	DefaultVaultKVPrefix = "egressd/credentials"
	// DefaultVaultRefresh is how often secrets are re-read (with jitter).
	DefaultVaultRefresh = 30 * time.Second
	// DefaultVaultPathField, DefaultVaultPathHeader and
	// DefaultVaultPathFormat turn a credentials.vault.paths entry's
	// {"token": "t"} into Authorization: Bearer t, as the KV shape
	// {"token": ...} does.
	DefaultVaultPathField  = "token"
	DefaultVaultPathHeader = "Authorization"
	DefaultVaultPathFormat = "Bearer {}"
	// DefaultKubernetesJWTFile is the service account token the kubernetes
	// auth method presents when jwt_file is empty.
	DefaultKubernetesJWTFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"

	// DefaultHooksFailClosed turns every failed pre_tool_execution call into
	// an explicit deny; false lets the runtime fail open, as it does alone.
	DefaultHooksFailClosed = true

	// DefaultReadHeader bounds how long a client may take to send its
	// request head (slowloris).
	DefaultReadHeader = 10 * time.Second
	// DefaultMaxHeaderBytes bounds a request head; larger heads get 431.
	DefaultMaxHeaderBytes = 65536
	// DefaultDial bounds one upstream TCP connect.
	DefaultDial = 10 * time.Second
	// DefaultDNS bounds one name resolution.
	DefaultDNS = 5 * time.Second
	// DefaultResponseHeader bounds the wait for the upstream's response
	// head (504 upstream_timeout).
	DefaultResponseHeader = 30 * time.Second
	// DefaultClientIdle closes idle keep-alive client connections.
	DefaultClientIdle = 5 * time.Minute
	// DefaultTunnelIdle closes a tunnel with no bytes either way; active
	// tunnels are never cut.
	DefaultTunnelIdle = time.Hour
	// DefaultStreamIdle ends a forwarded request stream (its body's reads) or an
	// upgraded connection with no bytes either way; a quiet gRPC stream or
	// WebSocket lives until then.
	DefaultStreamIdle = time.Hour
	// DefaultUpstreamIdle closes idle keep-alive upstream connections; an
	// upstream that closes them sooner costs a retry on a new connection.
	DefaultUpstreamIdle = 90 * time.Second
	// DefaultMaxConnections is per listener; beyond it new connections get 503.
	DefaultMaxConnections = 10000
	// DefaultHookBodyBytes bounds hook request and decision bodies; larger
	// ones are a hook failure (deny when fail-closed).
	DefaultHookBodyBytes int64 = 1 << 20
	// DefaultLeafMints bounds how many interception leaves are minted at once
	// (a key and a signature each, CPU work): a flood of new hosts queues
	// for a slot instead of starving requests already in flight.
	DefaultLeafMints = 4
	// DefaultHookBufferBytes bounds all hook bodies buffered at once (requests
	// and decisions, process-wide): 32 hook bodies of the default size. Past it a
	// pre-tool call gets the fail-closed deny and anything else 503, so many
	// large or stalled hook bodies cannot exhaust memory.
	DefaultHookBufferBytes int64 = 32 << 20
	// DefaultClientWrite closes a client that reads nothing for this long while
	// egressd writes to it (pipelining without reading, a stalled download), so
	// it cannot hold a connection slot and a goroutine forever.
	DefaultClientWrite = 30 * time.Second
	// DefaultMemory is limits.memory's default, auto (0): a quarter of the
	// cgroup's memory limit (or of GOMEMLIMIT), 256 MiB when neither is set.
	DefaultMemory int64 = 0
	// MinMemory is the smallest explicit limits.memory: hook bodies get half of
	// the budget (at most limits.hook_buffer_bytes), and one of the default
	// size must fit there with room for the rest.
	MinMemory int64 = 8 << 20
	// DefaultDrain is how long SIGTERM lets in-flight requests finish before
	// egressd closes what is left (tunnels, WebSockets) and exits; the
	// Kubernetes terminationGracePeriodSeconds must be longer.
	DefaultDrain = 10 * time.Second

	// DefaultDNSRefusedNames answers a name off the allowlist with egressd's own
	// address, never forwarding it: the client then connects to egressd and
	// reads the 403 and its reason, where REFUSED shows it only "could not
	// resolve host".
	DefaultDNSRefusedNames = RefusedNamesSinkhole

	// DefaultDNSMaxTCPConnections bounds the DNS guard's open TCP connections;
	// one more is closed at once. A sandbox resolves over UDP and falls back to
	// TCP only for truncated answers (the guard's are at most 1232 bytes), so a
	// few hundred at once is far past honest use and costs a few MiB at most.
	DefaultDNSMaxTCPConnections = 256
	// DefaultDNSMaxTCPPerClient bounds one client IP's open TCP connections to
	// the DNS guard; one more is closed at once.
	DefaultDNSMaxTCPPerClient = 32
	// DefaultDNSTCPIdle closes a DNS TCP connection with no query for this long
	// (miekg/dns's default, in line with RFC 7766 §6.2.3).
	DefaultDNSTCPIdle = 8 * time.Second
	// DefaultDNSTCPMaxQueries is how many queries one DNS TCP connection may
	// carry before the guard closes it.
	DefaultDNSTCPMaxQueries = 128

	// DefaultLogLevel and DefaultLogFormat: one JSON line per request at info.
	DefaultLogLevel  = LevelInfo
	DefaultLogFormat = FormatJSON

	// DefaultStateDir holds the generated CA and hook signing key.
	DefaultStateDir = ".egressd"
	// DefaultCAPublicDir is tls.ca_public_dir's default, inside state_dir: the
	// CA's public files, which `egressd ca env` points clients at.
	DefaultCAPublicDir = "ca"
)

// defaultPorts returns the ports an allowlist entry without "ports"
// allows (network.default_ports), fresh on each call so no caller can
// change another's.
func defaultPorts() []uint16 { return allowlist.DefaultPorts() }

// Limits on input, so that a hostile or broken file cannot exhaust memory.
const (
	// maxFileBytes bounds a config or policy file read from disk.
	maxFileBytes = 16 << 20
	// maxProblems bounds one ValidationError; the rest are summarised.
	maxProblems = 100
	// maxNodes bounds the nodes one decode visits, aliases expanded, so
	// that aliases cannot blow a small document up into a huge one.
	maxNodes = 1 << 20
	// maxSuggestDistance is the largest edit distance at which an unknown
	// key gets a "did you mean" suggestion.
	maxSuggestDistance = 2
)

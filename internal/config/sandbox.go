package config

import (
	"bytes"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// A sandbox spec is what a sidecar's files say for one sandbox, registered with a
// node at runtime (docs/node.md). It is validated as the node's own config with
// the spec's sections in place, by the same validator and policy compiler, so a
// spec's problems read like a config's: listeners[0].address,
// environment.network.allowlist[2].domain, limits.max_connections.

// SandboxIDPattern is what a sandbox ID may look like: it names a file, an API
// path and the sandbox claim of hook assertions.
var SandboxIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// SandboxPlaceholder in a kv_prefix stands for the sandbox's ID.
const SandboxPlaceholder = "{sandbox}"

// rawSandbox is a sandbox spec, key for key.
type rawSandbox struct {
	Netns       string                `yaml:"netns"`
	Listeners   []rawListener         `yaml:"listeners"`
	DNS         rawDNS                `yaml:"dns"`
	Environment rawDocument           `yaml:"environment"`
	Hooks       rawHooks              `yaml:"hooks"`
	Credentials rawSandboxCredentials `yaml:"credentials"`
	Limits      rawLimits             `yaml:"limits"`
}

// rawSandboxCredentials is the sandbox's own credential scope: a file of its own,
// or a Vault KV prefix of its own under the node's Vault session.
type rawSandboxCredentials struct {
	KVPrefix string `yaml:"kv_prefix"`
	File     string `yaml:"file"`
}

// rawDocument keeps a sub-document (the spec's environment) as its node, for the
// policy compiler.
type rawDocument struct{ node *yaml.Node }

func (r *rawDocument) decodeNode(_ *decoder, n *yaml.Node, _ string) { r.node = n }

// sandboxKeys are the top-level keys of a spec: the problems of the node's own
// sections, which the spec's validation meets again, are not the spec's.
var sandboxKeys = append([]string{"id"}, fieldsOf(reflect.TypeFor[rawSandbox]()).names...)

// Sandbox is a validated sandbox spec.
type Sandbox struct {
	ID    string
	Netns string // the network namespace its listeners open in; "" for the node's own
	// Config is the node's config with the spec's listeners, DNS guard, hooks,
	// credentials and limits in place, and its environment as Rules.
	Config *Config
	// Hash is the hex SHA-256 of the spec's bytes.
	Hash string
	// Share is what the spec's own limits ask of the node's budgets.
	Share Share
}

// Share is what a sandbox spec's limits.memory, limits.max_connections and
// limits.hook_buffer_bytes set, each 0 when the spec is silent (or memory is
// auto): the node then gives the sandbox its default share (docs/node.md).
type Share struct {
	Memory          int64
	MaxConnections  int
	HookBufferBytes int64
}

// shareOf is the Share the spec's limits r ask for, as validated in l.
func shareOf(r rawLimits, l Limits) Share {
	var s Share
	if r.Memory.set && r.Memory.n > 0 {
		s.Memory = l.Memory
	}
	if r.MaxConnections != nil {
		s.MaxConnections = l.MaxConnections
	}
	if r.HookBuffer != nil {
		s.HookBufferBytes = l.HookBufferBytes
	}
	return s
}

// ParseSandbox validates the spec data (JSON or YAML) of sandbox id against the
// node's config. The spec's relative paths (hooks.file, hooks.runtime_auth.file,
// credentials.file) resolve against baseDir ("": the node config's directory), the
// node's against its own directory. Every error it returns is a *ValidationError;
// warnings are on the returned Sandbox's Config.Warnings.
func ParseSandbox(node *Config, id string, data []byte, baseDir string) (*Sandbox, error) {
	ps := newProblems()
	if !node.Node.Enabled() || node.raw == nil {
		ps.errorf("", "the operator config has no node section: sandboxes are registered only with a node (docs/node.md)")
		return nil, ps.err()
	}
	if !SandboxIDPattern.MatchString(id) {
		ps.errorf("id", "invalid sandbox ID %s: use 1 to 63 lower-case letters, digits or '-', starting with a letter or digit", quoteShort(id))
	}
	spec, ok := decodeSandbox(data, ps)
	if !ok {
		return nil, ps.err()
	}
	decoded := len(ps.list) // the spec's own: unknown keys included
	resolveSpecPaths(spec, or(baseDir, node.baseDir))
	raw := sandboxRaw(node, spec, id, ps)
	cfg := validate(raw, node.baseDir, ps)
	cfg.baseDir = node.baseDir
	cfg.raw = raw
	netns := sandboxNetns(spec.Netns, ps)
	sandboxHooksListeners(cfg, netns, ps)
	cfg.Rules = sandboxPolicy(spec.Environment.node, cfg, ps)
	ps.list = append(ps.list[:decoded], slices.DeleteFunc(ps.list[decoded:], func(p Problem) bool { return !specProblem(p, node) })...)
	if err := ps.err(); err != nil {
		return nil, err
	}
	cfg.Warnings = ps.warnings()
	cfg.Hash = hashOf(data)
	return &Sandbox{ID: id, Netns: netns, Config: cfg, Hash: cfg.Hash, Share: shareOf(spec.Limits, cfg.Limits)}, nil
}

// decodeSandbox reads a spec: JSON when it starts with '{', else YAML.
func decodeSandbox(data []byte, ps *problems) (*rawSandbox, bool) {
	var root *yaml.Node
	var err error
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		root, err = parseJSON(data)
	} else {
		root, err = parseYAML(data)
	}
	switch {
	case err != nil && bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")):
		p := jsonProblem(err)
		p.Path = ""
		ps.add(p)
		return nil, false
	case err != nil:
		ps.add(yamlProblem(err))
		return nil, false
	case root == nil || root.Kind != yaml.MappingNode:
		ps.add(Problem{Msg: `a sandbox spec is a mapping, e.g. {"listeners": [...], "environment": {"network": {"allowlist": [...]}}}`})
		return nil, false
	}
	spec := &rawSandbox{}
	newDecoder(ps).decode(root, reflect.ValueOf(spec).Elem(), "")
	return spec, true
}

// sandboxRaw is the node's raw config with the spec's sections in place: its
// listeners (a netns listener is redirect: local by nature), and its DNS guard,
// hooks, credentials and limits over the node's.
func sandboxRaw(node *Config, spec *rawSandbox, id string, ps *problems) *rawConfig {
	raw := *node.raw
	raw.Node, raw.Policy = nil, rawPolicy{}
	raw.Listeners = slices.Clone(spec.Listeners)
	for i := range raw.Listeners {
		if l := &raw.Listeners[i]; spec.Netns != "" && l.Mode == ModeTransparent && l.Redirect == "" {
			l.Redirect = RedirectLocal
		}
	}
	overlay(&raw.DNS, spec.DNS)
	overlay(&raw.Hooks, spec.Hooks)
	overlay(&raw.Limits, spec.Limits)
	if spec.Hooks.SigningKey != (rawSecretRef{}) {
		ps.errorf("hooks.signing_key", "the node's hooks.signing_key signs every sandbox's assertions; remove it from the spec")
	}
	raw.Credentials = sandboxCredentials(node, spec.Credentials, id, ps)
	return &raw
}

// resolveSpecPaths makes the spec's relative file paths absolute against dir.
func resolveSpecPaths(spec *rawSandbox, dir string) {
	v := &validator{baseDir: dir}
	spec.Hooks.File, spec.Hooks.RuntimeAuth.File = v.path(spec.Hooks.File), v.path(spec.Hooks.RuntimeAuth.File)
	spec.Credentials.File = v.path(spec.Credentials.File)
}

// overlay sets each field of dst that src sets (a non-zero raw value: a present key).
func overlay[T any](dst *T, src T) {
	d, s := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src)
	for i := range s.NumField() {
		if !s.Field(i).IsZero() {
			d.Field(i).Set(s.Field(i))
		}
	}
}

// sandboxCredentials is the sandbox's credential scope: its own file, its own KV
// prefix, or the node's backend with {sandbox} expanded in the KV prefix.
func sandboxCredentials(node *Config, r rawSandboxCredentials, id string, ps *problems) rawCredentials {
	c := node.raw.Credentials
	expand := func(s string) string { return strings.ReplaceAll(s, SandboxPlaceholder, id) }
	switch {
	case r.KVPrefix != "" && r.File != "":
		ps.errorf("credentials", "set kv_prefix or file, not both")
	case r.File != "":
		c.Backend, c.File = BackendFile, r.File
	case r.KVPrefix != "" && node.Credentials.Backend != BackendVault:
		ps.errorf("credentials.kv_prefix", "the node's credentials.backend is %s, not vault: name the sandbox's own file instead (credentials.file)",
			node.Credentials.Backend)
	case r.KVPrefix != "":
		c.Vault.KVPrefix = expand(r.KVPrefix)
	default:
		c.Vault.KVPrefix = expand(node.Credentials.Vault.KVPrefix)
	}
	return c
}

// sandboxHooksListeners refuses a role: hooks listener inside the sandbox's own
// namespace that admits everyone: every process of the sandbox reaches it, and
// with hooks.identify: listener its traffic would be taken for the runtime's hook
// calls (signed as such, and never refused for memory).
func sandboxHooksListeners(cfg *Config, netns string, ps *problems) {
	if netns == "" || cfg.Hooks.Identify != IdentifyListener {
		return
	}
	for i, l := range cfg.Listeners {
		if l.Role == RoleHooks && l.PeerUIDs == nil {
			ps.errorf(indexPath("listeners", i)+".peer_uids", "a role: hooks listener inside the sandbox's netns is reachable by every "+
				"process of the sandbox: set peer_uids to the agent runtime's UID, so no other process's traffic is taken for its hook calls "+
				"(or use hooks.identify: runtime_auth)")
		}
	}
}

// sandboxNetns checks the spec's network namespace path.
func sandboxNetns(s string, ps *problems) string {
	if s != "" && (!filepath.IsAbs(s) || filepath.Clean(s) != s) {
		ps.errorf("netns", "%s is not a clean absolute path, e.g. /var/run/netns/sbx-42", quoteShort(s))
	}
	return s
}

// sandboxPolicy compiles the spec's environment, its problems under "environment".
func sandboxPolicy(root *yaml.Node, cfg *Config, ps *problems) *Policy {
	if root == nil {
		ps.errorf("environment", `required: the sandbox's policy, e.g. {"network": {"allowlist": [{"domain": "api.github.com"}]}}`)
		return nil
	}
	pps := newProblems()
	p := compilePolicy(newDecoder(pps), root, nil, cfg.AllowlistOptions())
	for _, pr := range pps.list {
		pr.Path = strings.TrimSuffix("environment."+strings.TrimPrefix(pr.Path, "policy"), ".")
		if pr.Line == 0 {
			pr.Line = root.Line
		}
		ps.add(pr)
	}
	return p
}

// specProblem reports whether p is about the spec: under one of its keys, and not
// a warning the node's own config already has.
func specProblem(p Problem, node *Config) bool {
	top, _, _ := strings.Cut(p.Path, ".")
	top, _, _ = strings.Cut(top, "[")
	if p.Path != "" && !slices.Contains(sandboxKeys, top) || isWithin(p.Path, "credentials.vault") {
		return false
	}
	return !slices.ContainsFunc(node.Warnings, func(w Problem) bool { return w.Path == p.Path && w.Msg == p.Msg })
}

package config

import (
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/docker/go-units"

	"github.com/egressd/egressd/internal/allowlist"
)

// validator turns raw values into validated ones, recording problems by
// path. Each method returns a usable value even when it reports a problem
// (the default, typically), so that checks further on, and the policy
// compiled with these options, still run and report their own problems.
type validator struct {
	ps      *problems
	baseDir string
}

// idPattern is what environment and listener names may look like: they
// appear in logs, metrics labels and hook assertions.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// validate checks raw and returns the Config it describes.
func validate(raw *rawConfig, baseDir string, ps *problems) *Config {
	v := &validator{ps: ps, baseDir: baseDir}
	node := v.node(raw.Node)
	cfg := &Config{
		Version:     v.version(raw.Version),
		Environment: v.environment(raw.Environment),
		Listeners:   v.listeners(raw.Listeners, node.Enabled()),
		Policy:      v.policySource(raw.Policy, node.Enabled()),
		Network:     v.network(raw.Network),
		DNS:         v.dns(raw.DNS),
		TLS:         v.tls(raw.TLS),
		Credentials: v.credentials(raw.Credentials),
		Hooks:       v.hooks(raw.Hooks),
		Limits:      v.limits(raw.Limits),
		Log:         v.log(raw.Log),
		StateDir:    v.path(or(raw.StateDir, DefaultStateDir)),
		Node:        node,
	}
	cfg.Admin = v.admin(raw.Admin, cfg.Listeners)
	cfg.Readiness = Readiness{RequireCredentials: raw.Readiness.RequireCredentials}
	cfg.TLS.CAPublicDir = v.path(raw.TLS.CAPublicDir)
	if cfg.TLS.CAPublicDir == "" {
		cfg.TLS.CAPublicDir = filepath.Join(cfg.StateDir, DefaultCAPublicDir)
	}
	return cfg
}

func (v *validator) version(ver *int) int {
	switch {
	case ver == nil:
		v.ps.errorf("version", "required; add version: 1 at the top")
	case *ver != 1:
		v.ps.errorf("version", "unsupported version %d; this egressd reads version 1", *ver)
	}
	return 1
}

func (v *validator) environment(env string) string {
	env = or(env, DefaultEnvironment)
	if !idPattern.MatchString(env) {
		v.ps.errorf("environment", "invalid id %s: use 1 to 64 letters, digits, '_', '.' or '-'", quoteShort(env))
	}
	return env
}

// node checks node mode's section: a node needs a way to register sandboxes.
func (v *validator) node(r *rawNode) Node {
	if r == nil {
		return Node{}
	}
	n := Node{
		SandboxesDir: v.path(r.SandboxesDir),
		APISocket:    v.path(r.APISocket),
		MaxSandboxes: positive(v, r.MaxSandboxes, "node.max_sandboxes", DefaultMaxSandboxes),
	}
	if !n.Enabled() {
		v.ps.errorf("node", "set node.sandboxes_dir, node.api_socket or both, e.g. api_socket: %s", DefaultAPISocket)
	}
	return n
}

// listeners checks each listener, then that names and addresses are unique. A
// node may have none: its sandboxes bring their own.
func (v *validator) listeners(raws []rawListener, optional bool) []Listener {
	if len(raws) == 0 && optional {
		return nil
	}
	if len(raws) == 0 {
		v.ps.errorf("listeners", "at least one listener is required, e.g. [{name: sandbox, address: %s}]", DefaultListenerAddress)
		return nil
	}
	ls := make([]Listener, len(raws))
	names := map[string]string{}
	for i, r := range raws {
		path := indexPath("listeners", i)
		ls[i] = v.listener(r, path)
		if first, dup := names[r.Name]; dup && r.Name != "" {
			v.ps.errorf(path+".name", "duplicate name %q (also %s)", r.Name, first)
		}
		names[r.Name] = path
		for j := range i {
			if conflicts(ls[i].Address, ls[j].Address) {
				v.ps.errorf(path+".address", "%s is already used by %s", ls[i].Address, indexPath("listeners", j))
				break
			}
		}
	}
	return ls
}

func (v *validator) listener(r rawListener, path string) Listener {
	l := Listener{
		Name: r.Name,
		Mode: v.oneOf(r.Mode, path+".mode", DefaultMode, ModeProxy, ModeTransparent),
		Role: v.oneOf(r.Role, path+".role", DefaultRole, RoleSandbox, RoleHooks),
	}
	switch {
	case r.Name == "":
		v.ps.errorf(path+".name", "required, e.g. name: %s", DefaultListenerName)
	case !idPattern.MatchString(r.Name):
		v.ps.errorf(path+".name", "invalid name %s: use 1 to 64 letters, digits, '_', '.' or '-'", quoteShort(r.Name))
	}
	if r.Address == "" {
		v.ps.errorf(path+".address", "required, e.g. address: %s", DefaultListenerAddress)
		return l
	}
	l.Address, _ = v.addrPort(r.Address, path+".address", DefaultListenerAddress, true)
	l.Redirect = v.redirect(r, l, path)
	l.PeerUIDs = v.peerUIDs(r, l, path)
	return l
}

// peerUIDs checks a listener's peer_uids: only a loopback listener's peers are
// this host's processes, whose users the kernel knows.
func (v *validator) peerUIDs(r rawListener, l Listener, path string) []uint32 {
	switch {
	case r.PeerUIDs == nil:
		return nil
	case len(r.PeerUIDs) == 0:
		v.ps.errorf(path+".peer_uids", "empty: it would admit no connection; list the agent runtime's UID, or drop the key")
	case l.Address.IsValid() && !l.Address.Addr().IsLoopback():
		v.ps.errorf(path+".peer_uids", "only a loopback listener's peers are processes of this host, whose users egressd can read; "+
			"listen on 127.0.0.1 (inside the sandbox's netns) or drop peer_uids")
	}
	return slices.Clone(r.PeerUIDs)
}

// admin parses admin.address ("" turns the admin listener off) and
// admin.health_address, keeps both apart from the sandbox's listeners and from
// each other, and refuses a routable admin listener without exposed and a token.
func (v *validator) admin(r rawAdmin, ls []Listener) Admin {
	a := Admin{Pprof: r.Pprof, Exposed: r.Exposed, Token: SecretRef{Credential: r.Token.Credential, File: v.path(r.Token.File)}}
	if r.Token.Credential != "" && r.Token.File != "" {
		v.ps.errorf("admin.token", "set credential or file, not both")
	}
	s := DefaultAdminAddress
	if r.Address != nil {
		s = *r.Address
	}
	a.HealthAddress, a.HealthSocket = v.endpoint(r.HealthAddress, "admin.health_address", DefaultHealthExample, ls)
	if s == "" {
		if r.Pprof {
			v.ps.errorf("admin.pprof", "needs the admin listener; set admin.address or drop admin.pprof")
		}
		return a
	}
	a.Address, a.Socket = v.endpoint(s, "admin.address", DefaultAdminAddress, ls)
	switch {
	case a.HealthSocket != "" && a.HealthSocket == a.Socket:
		v.ps.errorf("admin.health_address", "%s is admin.address too: give the health listener its own address", a.HealthSocket)
	case conflicts(a.HealthAddress, a.Address):
		v.ps.errorf("admin.health_address", "%s is already used by admin.address; give the health listener its own port", a.HealthAddress)
	}
	v.adminExposure(a)
	return a
}

// adminExposure refuses an admin listener on a routable address unless the
// operator says it is on purpose (admin.exposed) and protects it with a token:
// reload, explain and the sandbox's placeholders would be open to the network.
func (v *validator) adminExposure(a Admin) {
	if !a.Address.IsValid() || a.Address.Addr().IsLoopback() {
		return
	}
	switch {
	case !a.Exposed:
		v.ps.errorf("admin.address", "%s is routable: reload, explain and the sandbox's placeholders would be reachable "+
			"from the network; use 127.0.0.1:%d or unix:///run/egressd/admin.sock, and put probes and Prometheus on "+
			"admin.health_address (e.g. %s), which serves only /healthz, /readyz and /metrics; or, to expose it "+
			"on purpose, set admin.exposed: true and admin.token: {credential: ID} or {file: path}",
			a.Address, a.Address.Port(), DefaultHealthExample)
	case a.Token == (SecretRef{}):
		v.ps.errorf("admin.token", "required with admin.exposed on the routable %s: {credential: ID} or {file: path}, "+
			"the Bearer token every admin request must carry; or move admin.address to 127.0.0.1 and probes to "+
			"admin.health_address", a.Address)
	}
}

// endpoint parses an admin or health address: "" (none), unix:///path (a Unix
// socket), or an ip:port kept apart from the sandbox's listeners.
func (v *validator) endpoint(s, path, example string, ls []Listener) (netip.AddrPort, string) {
	if s == "" {
		return netip.AddrPort{}, ""
	}
	if rest, ok := strings.CutPrefix(s, UnixPrefix); ok {
		if rest == "" {
			v.ps.errorf(path, "%s names no socket path, e.g. %s/run/egressd/admin.sock", quoteShort(s), UnixPrefix)
			return netip.AddrPort{}, ""
		}
		return netip.AddrPort{}, v.path(rest)
	}
	ap, ok := v.addrPort(s, path, example, true)
	if !ok {
		return netip.AddrPort{}, ""
	}
	for i, l := range ls {
		if conflicts(ap, l.Address) {
			v.ps.errorf(path, "%s is already used by %s; the admin and health listeners must never be the sandbox's", ap, indexPath("listeners", i))
			break
		}
	}
	return ap, ""
}

// redirect checks listeners[].redirect against the listener's mode and address:
// a REDIRECT in egressd's own namespace delivers to loopback, a gateway's DNAT can
// never reach it.
func (v *validator) redirect(r rawListener, l Listener, path string) string {
	if r.Redirect == "" {
		if l.Mode == ModeTransparent && l.Address.Addr().IsLoopback() {
			v.ps.warnf(path+".address", "a transparent listener on %s: a REDIRECT from another namespace can never reach it "+
				"(use the sandbox-facing interface); when the REDIRECT runs in egressd's own namespace (a pod sidecar), "+
				"loopback is right: say so with redirect: %s", l.Address.Addr(), RedirectLocal)
		}
		return ""
	}
	red := v.oneOf(r.Redirect, path+".redirect", "", RedirectLocal, RedirectGateway)
	switch {
	case l.Mode != ModeTransparent:
		v.ps.errorf(path+".redirect", "only for a transparent listener (mode: %s)", ModeTransparent)
	case red == RedirectLocal && l.Address.IsValid() && !l.Address.Addr().IsLoopback():
		v.ps.warnf(path+".address", "redirect: local delivers to 127.0.0.1 or ::1, not %s", l.Address.Addr())
	case red == RedirectGateway && l.Address.Addr().IsLoopback():
		v.ps.errorf(path+".address", "redirect: gateway's DNAT can never reach %s: use the sandbox-facing address", l.Address.Addr())
	}
	return red
}

// conflicts reports whether two listen addresses would collide: the same
// non-zero port on the same address, or on any address when one of them
// is unspecified (0.0.0.0, ::).
func conflicts(a, b netip.AddrPort) bool {
	if !a.IsValid() || !b.IsValid() || a.Port() == 0 || a.Port() != b.Port() {
		return false
	}
	return a.Addr() == b.Addr() || a.Addr().IsUnspecified() || b.Addr().IsUnspecified()
}

// addrPort parses an ip:port literal. Host names are refused: a listener
// must not depend on DNS, and a resolver cannot be found through itself.
func (v *validator) addrPort(s, path, example string, portZeroOK bool) (netip.AddrPort, bool) {
	ap, err := netip.ParseAddrPort(s)
	if err == nil && (ap.Port() != 0 || portZeroOK) {
		return ap, true
	}
	host, port, serr := net.SplitHostPort(s)
	switch _, herr := netip.ParseAddr(host); {
	case serr != nil && isAddr(s):
		v.ps.errorf(path, "%s has no port, e.g. %s", quoteShort(s), example)
	case serr != nil:
		v.ps.errorf(path, "invalid address %s: want ip:port, e.g. %s", quoteShort(s), example)
	case host == "":
		v.ps.errorf(path, "%s has no IP address: use e.g. %s, or 0.0.0.0:%s for every interface", quoteShort(s), example, port)
	case herr != nil:
		v.ps.errorf(path, "%s is not an IP address: use an IP address, e.g. %s", quoteShort(host), example)
	case err == nil:
		v.ps.errorf(path, "port 0 is not allowed here, e.g. %s", example)
	default:
		v.ps.errorf(path, "invalid port %s: want 1 to 65535, e.g. %s", quoteShort(port), example)
	}
	return netip.AddrPort{}, false
}

// isAddr reports whether s is an IP address without a port.
func isAddr(s string) bool {
	_, err := netip.ParseAddr(strings.Trim(s, "[]"))
	return err == nil
}

// optionalAddr validates an ip:port that may be empty, returning its
// canonical form.
func (v *validator) optionalAddr(s, path, example string, portZeroOK bool) string {
	if s == "" {
		return ""
	}
	if ap, ok := v.addrPort(s, path, example, portZeroOK); ok {
		return ap.String()
	}
	return ""
}

// policySource checks that exactly one of policy.file and
// policy.allowlist is set. The inline entries are compiled later, with
// the network and TLS options (Config.loadPolicy).
func (v *validator) policySource(r rawPolicy, optional bool) PolicySource {
	switch {
	case optional && r.File == "" && r.Allowlist == nil:
	case r.File != "" && r.Allowlist != nil:
		v.ps.errorf("policy", "set policy.file or policy.allowlist, not both")
	case r.File == "" && r.Allowlist == nil:
		v.ps.errorf("policy", "required: set policy.file (an environment JSON, e.g. %s) or policy.allowlist", filepath.Base(DefaultPolicyFile))
	case r.File != "":
		return PolicySource{File: v.path(r.File)}
	}
	return PolicySource{}
}

func (v *validator) network(r rawNetwork) Network {
	n := Network{
		Resolver:         v.optionalAddr(r.Resolver, "network.resolver", "1.1.1.1:53", false),
		AllowCIDRs:       v.cidrs(r.AllowCIDRs, "network.allow_cidrs"),
		UnsafeAllowCIDRs: v.cidrs(r.UnsafeAllowCIDRs, "network.unsafe_allow_cidrs"),
		DefaultPorts:     v.defaultPorts(r.DefaultPorts),
	}
	if len(n.UnsafeAllowCIDRs) > 0 {
		v.ps.warnf("network.unsafe_allow_cidrs", "opens %s to egressd's dialer (metadata and egressd's own addresses stay closed): for development and tests only", joinPrefixes(n.UnsafeAllowCIDRs))
	}
	return n
}

// cidrs parses a list of CIDRs in canonical (masked) form.
func (v *validator) cidrs(raws []string, path string) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range raws {
		ip := indexPath(path, i)
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			if a, aerr := netip.ParseAddr(s); aerr == nil {
				v.ps.errorf(ip, "%s is an address, not a CIDR; use %s", quoteShort(s), netip.PrefixFrom(a, a.BitLen()))
			} else {
				v.ps.errorf(ip, "invalid CIDR %s, e.g. 10.0.0.0/8", quoteShort(s))
			}
		case p != p.Masked():
			v.ps.errorf(ip, "%s has host bits set; use %s", s, p.Masked())
		default:
			out = append(out, p)
		}
	}
	return out
}

// defaultPorts checks network.default_ports; absent means 80 and 443.
func (v *validator) defaultPorts(raws []int) []uint16 {
	if raws == nil {
		return defaultPorts()
	}
	if len(raws) == 0 {
		v.ps.errorf("network.default_ports", "empty: entries without ports would allow nothing; omit the key for [80, 443]")
		return defaultPorts()
	}
	ports, ok := v.ports(raws, "network.default_ports")
	if !ok {
		return defaultPorts()
	}
	return ports
}

// ports converts a list of ints to ports, reporting out-of-range and
// duplicate ones.
func (v *validator) ports(raws []int, path string) ([]uint16, bool) {
	ok := true
	out := make([]uint16, 0, len(raws))
	for i, p := range raws {
		switch {
		case p < 1 || p > 65535:
			v.ps.errorf(indexPath(path, i), "%d is not a port (1 to 65535)", p)
			ok = false
		case slices.Contains(out, uint16(p)):
			v.ps.errorf(indexPath(path, i), "duplicate port %d", p)
			ok = false
		default:
			out = append(out, uint16(p))
		}
	}
	return out, ok
}

func (v *validator) tls(r rawTLS) TLS {
	t := TLS{
		Intercept:      v.interceptMode(r.Intercept),
		CACert:         v.path(r.CACert),
		CAKey:          v.path(r.CAKey),
		UpstreamCAFile: v.path(r.UpstreamCAFile),
		DenyInTunnel: v.oneOf(r.DenyInTunnel, "tls.deny_in_tunnel", DefaultDenyInTunnel,
			DenyInTunnelAuto, DenyInTunnelAlways, DenyInTunnelNever),
	}
	switch {
	case r.CACert != "" && r.CAKey == "":
		v.ps.errorf("tls.ca_key", "required with tls.ca_cert (or leave both empty to generate a CA in state_dir)")
	case r.CAKey != "" && r.CACert == "":
		v.ps.errorf("tls.ca_cert", "required with tls.ca_key (or leave both empty to generate a CA in state_dir)")
	}
	return t
}

func (v *validator) credentials(r rawCredentials) Credentials {
	c := Credentials{
		Backend:  v.oneOf(r.Backend, "credentials.backend", DefaultBackend, BackendFile, BackendVault),
		File:     v.path(r.File),
		MaxStale: v.duration(r.MaxStale, "credentials.max_stale", DefaultMaxStale),
	}
	c.Vault = v.vault(r.Vault, c.Backend == BackendVault)
	if c.File == "" && c.Backend == BackendFile {
		// The documented default: credentials.json beside the config file, as
		// configs/quickstart.yaml names configs/credentials.json.
		c.File = v.path(filepath.Base(DefaultCredentialsFile))
	}
	return c
}

// vault checks the vault section. Its syntax is checked whatever the
// backend; what it requires only when used is checked when used. The
// environment (VAULT_ADDR, VAULT_TOKEN) is read here, at validation time,
// because the Vault client honours it too: a config that relies on it is
// valid only where it is set.
func (v *validator) vault(r rawVault, used bool) Vault {
	vc := Vault{
		Address:  r.Address,
		KVMount:  strings.Trim(or(r.KVMount, DefaultVaultKVMount), "/"),
		KVPrefix: strings.Trim(or(r.KVPrefix, DefaultVaultKVPrefix), "/"),
		Refresh:  v.duration(r.Refresh, "credentials.vault.refresh", DefaultVaultRefresh),
		Auth:     v.vaultAuth(r.Auth, used),
		Paths:    v.vaultPaths(r.Paths),
	}
	if r.Address != "" {
		v.vaultAddress(r.Address)
	} else if used && os.Getenv("VAULT_ADDR") == "" {
		v.ps.errorf("credentials.vault.address", "required for the vault backend (or set VAULT_ADDR), e.g. https://vault.internal:8200")
	}
	return vc
}

// vaultAddress checks that address is an http(s) URL, warning on clear
// text to anything but loopback.
func (v *validator) vaultAddress(address string) {
	u, err := url.Parse(address)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		v.ps.errorf("credentials.vault.address", "%s is not an http(s) URL, e.g. https://vault.internal:8200", quoteShort(address))
		return
	}
	if ip, err := netip.ParseAddr(u.Hostname()); u.Scheme == "http" && (err != nil || !ip.IsLoopback()) && u.Hostname() != "localhost" {
		v.ps.warnf("credentials.vault.address", "plain http: the Vault token and secrets cross the network in clear text; use https")
	}
}

// authFields lists, per method, the auth keys it reads; the others are
// ignored with a warning.
var authFields = map[string][]string{
	AuthToken:      {"token", "token_file"},
	AuthAppRole:    {"role_id_file", "secret_id_file", "mount"},
	AuthJWT:        {"role", "jwt_file", "mount"},
	AuthKubernetes: {"role", "jwt_file", "mount"},
}

func (v *validator) vaultAuth(r rawVaultAuth, used bool) VaultAuth {
	const p = "credentials.vault.auth"
	a := VaultAuth{
		Method:       v.oneOf(r.Method, p+".method", DefaultVaultAuthMethod, AuthToken, AuthAppRole, AuthJWT, AuthKubernetes),
		Token:        r.Token,
		TokenFile:    v.path(r.TokenFile),
		RoleIDFile:   v.path(r.RoleIDFile),
		SecretIDFile: v.path(r.SecretIDFile),
		Role:         r.Role,
		JWTFile:      v.path(r.JWTFile),
		Mount:        strings.Trim(r.Mount, "/"),
	}
	if a.Method != AuthToken && a.Mount == "" {
		a.Mount = a.Method
	}
	if a.Method == AuthKubernetes && a.JWTFile == "" {
		a.JWTFile = DefaultKubernetesJWTFile
	}
	if r.Token != "" && a.Method == AuthToken {
		v.ps.warnf(p+".token", "a token in the config file is a secret value; prefer token_file or VAULT_TOKEN")
	}
	set := map[string]string{"token": r.Token, "token_file": r.TokenFile, "role_id_file": r.RoleIDFile,
		"secret_id_file": r.SecretIDFile, "role": r.Role, "jwt_file": r.JWTFile, "mount": r.Mount}
	for _, k := range fieldsOf(reflect.TypeFor[rawVaultAuth]()).names {
		if set[k] != "" && !slices.Contains(authFields[a.Method], k) {
			v.ps.warnf(p+"."+k, "ignored with method %s", a.Method)
		}
	}
	if used {
		v.authRequired(r, a.Method)
	}
	return a
}

// authRequired reports the keys a method needs and lacks.
func (v *validator) authRequired(r rawVaultAuth, method string) {
	const p = "credentials.vault.auth"
	need := func(key, value string) {
		if value == "" {
			v.ps.errorf(p+"."+key, "required for method %s", method)
		}
	}
	switch method {
	case AuthToken:
		if r.Token == "" && r.TokenFile == "" && os.Getenv("VAULT_TOKEN") == "" {
			v.ps.errorf(p+".token_file", "method token needs token_file, token or VAULT_TOKEN")
		}
	case AuthAppRole:
		need("role_id_file", r.RoleIDFile)
		need("secret_id_file", r.SecretIDFile)
	case AuthJWT:
		need("role", r.Role)
		need("jwt_file", r.JWTFile)
	case AuthKubernetes:
		need("role", r.Role)
	}
}

func (v *validator) hooks(r rawHooks) Hooks {
	h := Hooks{
		File:       v.path(r.File),
		FailClosed: DefaultHooksFailClosed,
		SigningKey: SecretRef{Credential: r.SigningKey.Credential, File: v.path(r.SigningKey.File)},
	}
	if r.FailClosed != nil {
		h.FailClosed = *r.FailClosed
	}
	if r.SigningKey.Credential != "" && r.SigningKey.File != "" {
		v.ps.errorf("hooks.signing_key", "set credential or file, not both")
	}
	h.RuntimeAuth = SecretRef{Credential: r.RuntimeAuth.Credential, File: v.path(r.RuntimeAuth.File)}
	auth := h.RuntimeAuth != SecretRef{}
	def := IdentifyListener
	if auth {
		def = IdentifyRuntimeAuth
	}
	h.Identify = v.oneOf(r.Identify, "hooks.identify", def, IdentifyListener, IdentifyRuntimeAuth, IdentifyURL)
	switch {
	case r.RuntimeAuth.Credential != "" && r.RuntimeAuth.File != "":
		v.ps.errorf("hooks.runtime_auth", "set credential or file, not both")
	case h.Identify == IdentifyRuntimeAuth && !auth:
		v.ps.errorf("hooks.runtime_auth", "required with identify: runtime_auth: "+
			"{credential: ID} or {file: path} naming the token the runtime presents as Proxy-Authorization")
	case h.Identify != IdentifyRuntimeAuth && auth:
		v.ps.errorf("hooks.runtime_auth", "used only with identify: runtime_auth (identify is %s): "+
			"remove it, or set identify: runtime_auth", h.Identify)
	}
	return h
}

func (v *validator) dns(r rawDNS) DNS {
	const p = "dns."
	d := DNS{
		Listen:            v.optionalAddr(r.Listen, p+"listen", "127.0.0.1:53", true),
		RefusedNames:      v.oneOf(r.RefusedNames, p+"refused_names", DefaultDNSRefusedNames, RefusedNamesSinkhole, RefusedNamesRefuse),
		MaxTCPConnections: positive(v, r.MaxTCPConnections, p+"max_tcp_connections", DefaultDNSMaxTCPConnections),
		MaxTCPPerClient:   positive(v, r.MaxTCPPerClient, p+"max_tcp_per_client", DefaultDNSMaxTCPPerClient),
		TCPIdle:           v.duration(r.TCPIdle, p+"tcp_idle", DefaultDNSTCPIdle),
		TCPMaxQueries:     positive(v, r.TCPMaxQueries, p+"tcp_max_queries", DefaultDNSTCPMaxQueries),
	}
	if d.MaxTCPPerClient > d.MaxTCPConnections {
		v.ps.errorf(p+"max_tcp_per_client", "must be at most dns.max_tcp_connections (%d)", d.MaxTCPConnections)
		d.MaxTCPPerClient = d.MaxTCPConnections
	}
	return d
}

func (v *validator) limits(r rawLimits) Limits {
	const p = "limits."
	l := Limits{
		ReadHeader:     v.duration(r.ReadHeader, p+"read_header", DefaultReadHeader),
		Dial:           v.duration(r.Dial, p+"dial", DefaultDial),
		DNS:            v.duration(r.DNS, p+"dns", DefaultDNS),
		ResponseHeader: v.duration(r.ResponseHeader, p+"response_header", DefaultResponseHeader),
		ClientIdle:     v.duration(r.ClientIdle, p+"client_idle", DefaultClientIdle),
		TunnelIdle:     v.duration(r.TunnelIdle, p+"tunnel_idle", DefaultTunnelIdle),
		StreamIdle:     v.duration(r.StreamIdle, p+"stream_idle", DefaultStreamIdle),
		UpstreamIdle:   v.duration(r.UpstreamIdle, p+"upstream_idle", DefaultUpstreamIdle),
		MaxHeaderBytes: positive(v, r.MaxHeaderBytes, p+"max_header_bytes", DefaultMaxHeaderBytes),
		MaxConnections: positive(v, r.MaxConnections, p+"max_connections", DefaultMaxConnections),
		HookBodyBytes:  positive(v, r.HookBodyBytes, p+"hook_body_bytes", DefaultHookBodyBytes),
		LeafMints:      positive(v, r.LeafMints, p+"leaf_mints", DefaultLeafMints),
		ClientWrite:    v.duration(r.ClientWrite, p+"client_write", DefaultClientWrite),
		Drain:          v.duration(r.Drain, p+"drain", DefaultDrain),
	}
	l.HookBufferBytes = positive(v, r.HookBuffer, p+"hook_buffer_bytes", DefaultHookBufferBytes)
	if l.HookBufferBytes < l.HookBodyBytes {
		v.ps.errorf(p+"hook_buffer_bytes", "must be at least limits.hook_body_bytes (%d): one hook body must fit", l.HookBodyBytes)
		l.HookBufferBytes = l.HookBodyBytes
	}
	l.Memory = v.memory(r.Memory, l.HookBodyBytes)
	return l
}

// memory checks limits.memory: auto (0), or a size that holds two hook bodies
// (hook bodies get half of the budget) and at least MinMemory.
func (v *validator) memory(r rawByteSize, hookBody int64) int64 {
	if r.n == 0 {
		return DefaultMemory
	}
	if least := max(MinMemory, 2*hookBody); r.n < least {
		v.ps.errorf("limits.memory", `must be "auto" or at least %s: half of it holds hook bodies, and one of limits.hook_body_bytes must fit`,
			units.BytesSize(float64(least)))
		return DefaultMemory
	}
	return r.n
}

func (v *validator) log(r rawLog) Log {
	return Log{
		Level:  v.oneOf(r.Level, "log.level", DefaultLogLevel, LevelDebug, LevelInfo, LevelWarn, LevelError),
		Format: v.oneOf(r.Format, "log.format", DefaultLogFormat, FormatJSON, FormatConsole),
	}
}

// oneOf returns s, or def when s is empty, and reports a value outside
// allowed (returning def then, so later checks see a valid value).
func (v *validator) oneOf(s, path, def string, allowed ...string) string {
	if s == "" {
		return def
	}
	if !slices.Contains(allowed, s) {
		v.ps.errorf(path, "invalid value %s: use one of %s", quoteShort(s), strings.Join(allowed, ", "))
		return def
	}
	return s
}

// interceptMode checks tls.intercept against allowlist.InterceptModes.
func (v *validator) interceptMode(s string) allowlist.InterceptMode {
	modes := make([]string, len(allowlist.InterceptModes))
	for i, m := range allowlist.InterceptModes {
		modes[i] = string(m)
	}
	return allowlist.InterceptMode(v.oneOf(s, "tls.intercept", string(DefaultIntercept), modes...))
}

// duration returns d's value, or def when absent; it must be positive.
func (v *validator) duration(d rawDuration, path string, def time.Duration) time.Duration {
	if !d.set {
		return def
	}
	if d.d <= 0 {
		v.ps.errorf(path, "must be positive, e.g. %s", formatDuration(def))
		return def
	}
	return d.d
}

// positive returns *n, or def when n is nil; it must be positive.
func positive[T int | int64](v *validator, n *T, path string, def T) T {
	if n == nil {
		return def
	}
	if *n <= 0 {
		v.ps.errorf(path, "must be positive, e.g. %d", def)
		return def
	}
	return *n
}

// path resolves a relative file path against the config's directory.
func (v *validator) path(p string) string {
	if p == "" || filepath.IsAbs(p) || v.baseDir == "" {
		return p
	}
	return filepath.Join(v.baseDir, p)
}

// or returns s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// formatDuration renders d the way an operator writes it: 5m, not 5m0s.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// joinPrefixes renders prefixes as "a, b".
func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

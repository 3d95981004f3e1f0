package config

import (
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/egressd/egressd/internal/allowlist"
)

// This file decodes and checks credentials.vault.paths: credential ID ->
// a Vault path whose response's data holds the secret.
//
//	paths:
//	  agent-oidc: {path: identity/oidc/token/agent, field: token, header: Authorization, format: "Bearer {}"}

// rawVaultPaths is the mapping, in file order.
type rawVaultPaths struct {
	items []rawVaultPathItem
}

type rawVaultPathItem struct {
	id, path string // the credential ID and its config path
	r        rawVaultPath
}

type rawVaultPath struct {
	Path   string  `yaml:"path"`
	Field  string  `yaml:"field"`
	Header string  `yaml:"header"`
	Format *string `yaml:"format"` // nil: default; "" is an error
}

func (p *rawVaultPaths) decodeNode(d *decoder, n *yaml.Node, path string) {
	if n = d.deref(n); n.Kind != yaml.MappingNode {
		d.errorAt(path, n.Line, "expected a mapping of credential ID to {path, field, header, format}, got %s", describe(n))
		return
	}
	d.eachKey(n, path, func(id string, _, val *yaml.Node, kpath string) {
		var r rawVaultPath
		d.decode(val, reflect.ValueOf(&r).Elem(), kpath)
		p.items = append(p.items, rawVaultPathItem{id: id, path: kpath, r: r})
	})
}

// valuePlaceholder stands for the secret in a format.
const valuePlaceholder = "{}"

// vaultPaths checks every entry and returns them sorted by ID.
func (v *validator) vaultPaths(r rawVaultPaths) []VaultPath {
	out := make([]VaultPath, 0, len(r.items))
	for _, it := range r.items {
		out = append(out, v.vaultPath(it))
	}
	slices.SortFunc(out, func(a, b VaultPath) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (v *validator) vaultPath(it rawVaultPathItem) VaultPath {
	p := VaultPath{
		ID:     it.id,
		Path:   strings.Trim(it.r.Path, "/"),
		Field:  or(it.r.Field, DefaultVaultPathField),
		Header: http.CanonicalHeaderKey(or(it.r.Header, DefaultVaultPathHeader)),
		Format: DefaultVaultPathFormat,
	}
	if it.r.Format != nil {
		p.Format = *it.r.Format
	}
	// Problems under the entry first: one at the entry itself (a bad ID)
	// would hide them.
	if msg := vaultPathProblem(p.Path); msg != "" {
		v.ps.errorf(it.path+".path", "%s", msg)
	}
	if n := strings.Count(p.Format, valuePlaceholder); n != 1 {
		v.ps.errorf(it.path+".format", `must contain "{}" exactly once, where the value goes (has it %d times), e.g. format: "Bearer {}"`, n)
	} else if p.Format != strings.TrimSpace(p.Format) || !validHeaderText(p.Format) {
		v.ps.errorf(it.path+".format", "has leading or trailing whitespace or a control character; remove it")
	}
	v.pathIDAndHeader(it.path, p.ID, p.Header)
	return p
}

// pathIDAndHeader checks the credential ID and the header name with the
// allowlist's own rules (one entry that injects the header under the ID),
// so that both are checked exactly as a policy's are.
func (v *validator) pathIDAndHeader(path, id, header string) {
	if id == "" {
		v.ps.errorf(path, "a credential ID is empty")
	}
	_, err := allowlist.Compile([]allowlist.Entry{{
		Domain:     "vault-path.invalid",
		Credential: id,
		Transform:  []allowlist.Header{{Name: header, Value: "x"}},
	}}, allowlist.Options{})
	var ce *allowlist.CompileError
	if !errors.As(err, &ce) {
		return
	}
	for _, p := range ce.Problems { // the header's first, so that an ID error cannot hide it
		if p.Field == "transform" {
			v.ps.errorf(path+".header", "%s", p.Msg)
		}
	}
	for _, p := range ce.Problems {
		if p.Field != "transform" {
			v.ps.errorf(path, "%s", p.Msg)
		}
	}
}

// vaultPathProblem says what is wrong with a Vault API path, or "".
func vaultPathProblem(p string) string {
	switch {
	case p == "":
		return "required, e.g. path: identity/oidc/token/agent"
	case p == "v1" || strings.HasPrefix(p, "v1/"):
		return `give the path without the /v1/ API prefix, e.g. path: identity/oidc/token/agent`
	case strings.ContainsAny(p, "?#%\\"):
		return `contains "?", "#", "%" or "\"; give a plain Vault path, e.g. identity/oidc/token/agent`
	case !validHeaderText(p) || strings.ContainsAny(p, " \t"):
		return "contains whitespace or a control character"
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return `has an empty, "." or ".." segment`
		}
	}
	return ""
}

// validHeaderText reports whether s holds no control character (tab
// aside) and no DEL.
func validHeaderText(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f })
}

package config

import (
	"encoding/json"
	"fmt"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/egressd/egressd/internal/allowlist"
)

// Policy is a validated, compiled policy (environment.json).
type Policy struct {
	Allowlist *allowlist.Policy
	// Entries are the allowlist entries as parsed, in order, for explain and
	// check.
	Entries []allowlist.Entry
	// HooksJSON is the hooks.json document carried inline by the
	// environment's sources (the one whose path is .agents/hooks.json), or
	// nil. It is valid JSON; internal/hooks parses it.
	HooksJSON json.RawMessage
	Warnings  []Problem
	// Unrestricted is set for a document without "network" (the managed-agent platform's
	// meaning: no restriction): the allowlist is a single "*" that injects nothing, on
	// network.default_ports; the address guard still applies. /readyz reports it and check warns.
	Unrestricted bool
	// Disabled is set for "network": "disabled" or "allowlist": "disabled": the allowlist
	// is empty and every destination is denied (not_allowlisted).
	Disabled bool
	// Env is the environment's "env" section as far as egressd is concerned: variable
	// name -> credential ID, for {"NAME": {"credential": "id"}}; plain {"value": ...}
	// variables are the platform's business and left out. Nil when there is none.
	Env map[string]string
}

// Disabled is the managed-agent platform's spelling of "no network", as the value of
// "network" or of "allowlist".
const Disabled = "disabled"

// allowlistKind is what findAllowlist found.
type allowlistKind int

const (
	allowlistList         allowlistKind = iota // a list of entries (or nothing usable: reported)
	allowlistDisabled                          // "disabled": deny everything
	allowlistUnrestricted                      // no "network" at all: allow everything
)

// HooksSourcePath is the path of the sources item that carries hooks.json.
const HooksSourcePath = ".agents/hooks.json"

// shapeHint is the message for a document of none of the accepted shapes.
const shapeHint = `expected {"network": {"allowlist": [...]}} or {"allowlist": [...]}`

// LoadPolicy reads and validates the policy file at path. A read failure is
// a plain error; everything about the content is a *ValidationError whose
// problems name path as their File.
func LoadPolicy(path string, opts allowlist.Options) (*Policy, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return finishPolicy(readPolicy(data, path, opts))
}

// ParsePolicy validates and compiles a policy document. It accepts three
// shapes, told apart by their keys:
//
//   - a whole environment, {"network": {"allowlist": [...]}, "sources": [...], ...};
//     other top-level keys, and other keys inside "network", belong to the
//     managed platform and are ignored;
//   - just {"network": {"allowlist": [...]}};
//   - just {"allowlist": [...]}, with no other key.
//
// Problem paths follow the shape read: network.allowlist[3].credential or
// allowlist[3].credential. Every error it returns is a *ValidationError.
func ParsePolicy(data []byte, opts allowlist.Options) (*Policy, error) {
	return finishPolicy(readPolicy(data, "", opts))
}

// finishPolicy turns readPolicy's result into ParsePolicy's.
func finishPolicy(p *Policy, ps *problems) (*Policy, error) {
	if err := ps.err(); err != nil {
		return nil, err
	}
	p.Warnings = ps.warnings()
	return p, nil
}

// readPolicy decodes and compiles a policy document, with every problem
// recorded in the returned problems (their File set to file). The Policy
// is never nil, but holds what could be read only when there are no errors.
func readPolicy(data []byte, file string, opts allowlist.Options) (*Policy, *problems) {
	ps := newProblems()
	ps.file = file
	p := &Policy{}
	root, err := parseJSON(data)
	if err != nil {
		ps.add(jsonProblem(err))
		return p, ps
	}
	return compilePolicy(newDecoder(ps), root, data, opts), ps
}

// compilePolicy compiles the policy document root, recording problems through d.
// data is the document's text, for an inline hooks.json object as written; nil
// when root is part of another document (a sandbox spec's environment).
func compilePolicy(d *decoder, root *yaml.Node, data []byte, opts allowlist.Options) *Policy {
	p := &Policy{}
	if root.Kind != yaml.MappingNode {
		d.errorAt("policy", root.Line, "%s, got %s", shapeHint, describe(root))
		return p
	}
	al, prefix, kind := findAllowlist(d, root)
	var entries rawAllowlist
	switch {
	case kind == allowlistDisabled:
		p.Disabled, entries.disabled = true, true
	case kind == allowlistUnrestricted:
		p.Unrestricted = true
		entries.entries = []allowlist.Entry{{Domain: "*"}}
		d.ps.warnf("network", `the policy has no "network": every destination on network.default_ports is allowed (the managed-agent platform's `+
			`meaning), nothing is injected; add {"network": {"allowlist": [...]}} to restrict it, or "network": "disabled" to deny everything`)
	case al == nil:
		return p
	default:
		entries.decodeNode(d, al, prefix)
	}
	p.Allowlist, p.Entries = compileAllowlist(&entries, prefix, opts, d.ps)
	if prefix != "allowlist" {
		p.HooksJSON = findHooks(d, root, data)
		p.Env = findEnv(d, root)
	}
	return p
}

// envName is a POSIX environment variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// findEnv reads the "env" section: {"NAME": {"credential": "id"}} entries; others ignored.
func findEnv(d *decoder, root *yaml.Node) map[string]string {
	env, ok := mappingValue(root, "env")
	if !ok || isNull(env) {
		return nil
	}
	if env = d.deref(env); env.Kind != yaml.MappingNode {
		d.errorAt("env", env.Line, `expected a mapping of variable name to {"credential": "id"} or {"value": "..."}, got %s`, describe(env))
		return nil
	}
	out := map[string]string{}
	d.eachKey(env, "env", func(name string, k, v *yaml.Node, kpath string) {
		cred, ok := mappingValue(d.deref(v), "credential")
		if !ok {
			return
		}
		id, ok := d.str(cred, kpath+".credential")
		switch {
		case !ok:
		case !envName.MatchString(name):
			d.errorAt(kpath, k.Line, "%q is not an environment variable name; use letters, digits and _, not starting with a digit", name)
		case !allowlist.ValidCredentialID(id):
			d.errorAt(kpath+".credential", cred.Line, `credential ID %q is invalid; use 1-128 characters from A-Z a-z 0-9 . _ / -, starting with a letter or digit`, id)
		default:
			out[name] = id
		}
	})
	return out
}

// findAllowlist finds the allowlist node by the document's shape and
// returns it with the path prefix of its problems and its kind; a nil node
// of kind allowlistList means there is none (reported).
func findAllowlist(d *decoder, root *yaml.Node) (*yaml.Node, string, allowlistKind) {
	network, hasNetwork := mappingValue(root, "network")
	al, hasAllowlist := mappingValue(root, "allowlist")
	switch {
	case hasNetwork && hasAllowlist:
		d.errorAt("allowlist", keyLine(root, "allowlist"), `a top-level "allowlist" next to "network"; move it into "network"`)
		return nil, "", allowlistList
	case hasAllowlist:
		d.eachKey(root, "", func(key string, k, _ *yaml.Node, kpath string) {
			if key != "allowlist" {
				d.errorAt(kpath, k.Line, `unknown key; a policy of the {"allowlist": [...]} shape has no other key`)
			}
		})
		return al, "allowlist", kindOf(d.deref(al))
	case !hasNetwork:
		return noNetwork(d, root)
	}
	d.ps.setLine("network", keyLine(root, "network"))
	if network = d.deref(network); isDisabled(network) {
		return nil, "network", allowlistDisabled
	} else if network.Kind != yaml.MappingNode {
		d.errorAt("network", network.Line, `expected a mapping such as {"allowlist": [...]}, or "disabled", got %s`, describe(network))
		return nil, "", allowlistList
	}
	al, ok := mappingValue(network, "allowlist")
	if !ok {
		d.errorAt("network.allowlist", network.Line, `required: egressd enforces network.allowlist (an empty list or "disabled" denies everything)`)
		return nil, "", allowlistList
	}
	d.ps.setLine("network.allowlist", keyLine(network, "allowlist"))
	misplacedNetworkKeys(d, network)
	return al, "network.allowlist", kindOf(d.deref(al))
}

// misplacedNetworkKeys warns about egressd.yaml's network keys written into the
// policy's "network" by mistake: there they belong to the platform and egressd
// ignores them, so an allow_cidrs meant to open a range silently opens nothing.
func misplacedNetworkKeys(d *decoder, network *yaml.Node) {
	operator := fieldsOf(reflect.TypeOf(rawNetwork{})).names
	d.eachKey(network, "network", func(key string, k, _ *yaml.Node, kpath string) {
		if slices.Contains(operator, key) {
			d.ps.setLine(kpath, k.Line)
			d.ps.warnf(kpath, "egressd ignores this key in the policy: it is an egressd.yaml setting; move it to network.%s there", key)
		}
	})
}

// noNetwork is a document without "network" or "allowlist": unrestricted, unless a
// top-level key looks like a misspelt one or holds a list of {"domain": ...} entries (a
// typo or a wrong shape must not open everything).
func noNetwork(d *decoder, root *yaml.Node) (*yaml.Node, string, allowlistKind) {
	typo := false
	d.eachKey(root, "", func(key string, k, v *yaml.Node, kpath string) {
		if l := strings.ToLower(key); strings.Contains(l, "netw") || strings.Contains(l, "allow") || holdsEntries(d.deref(v)) {
			d.errorAt(kpath, k.Line, `unknown key; did you mean "network"? (%s)`, shapeHint)
			typo = true
		}
	})
	if typo {
		return nil, "", allowlistList
	}
	return nil, "network", allowlistUnrestricted
}

// holdsEntries reports whether n is a list with a mapping that has a "domain" key.
func holdsEntries(n *yaml.Node) bool {
	if n.Kind != yaml.SequenceNode {
		return false
	}
	for _, item := range n.Content {
		if _, ok := mappingValue(item, "domain"); ok {
			return true
		}
	}
	return false
}

func kindOf(al *yaml.Node) allowlistKind {
	if isDisabled(al) {
		return allowlistDisabled
	}
	return allowlistList
}

// isDisabled reports whether n is the string "disabled".
func isDisabled(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && n.Value == Disabled
}

// findHooks returns the content of the sources item whose path is
// .agents/hooks.json, as JSON: a string content is the document's text, an
// object content is the document itself. Other sources are ignored.
func findHooks(d *decoder, root *yaml.Node, data []byte) json.RawMessage {
	sources, ok := mappingValue(root, "sources")
	if !ok || isNull(sources) {
		return nil
	}
	d.ps.setLine("sources", keyLine(root, "sources"))
	items, ok := d.list(sources, "sources")
	if !ok {
		return nil
	}
	found := -1
	for i, item := range items {
		p, _ := mappingValue(d.deref(item), "path")
		if p == nil || p.Kind != yaml.ScalarNode || path.Clean(p.Value) != HooksSourcePath {
			continue
		}
		ip := indexPath("sources", i)
		d.ps.setLine(ip, item.Line)
		if found >= 0 {
			d.errorAt(ip, item.Line, "a second %s source (the first is sources[%d])", HooksSourcePath, found)
			continue
		}
		found = i
	}
	if found < 0 {
		return nil
	}
	return hooksContent(d, d.deref(items[found]), indexPath("sources", found), found, data)
}

// hooksContent extracts the content of the hooks source at index i.
func hooksContent(d *decoder, item *yaml.Node, path string, i int, data []byte) json.RawMessage {
	content, ok := mappingValue(item, "content")
	cpath := path + ".content"
	switch {
	case !ok:
		d.errorAt(cpath, item.Line, "required: the hooks.json document, as a JSON string or object")
	case content.Kind == yaml.ScalarNode && content.ShortTag() == "!!str":
		if err := json.Unmarshal([]byte(content.Value), new(json.RawMessage)); err != nil {
			d.errorAt(cpath, content.Line, "not a JSON document: %v", err)
			return nil
		}
		return json.RawMessage(content.Value)
	case content.Kind == yaml.MappingNode && data == nil:
		return nodeJSON(content)
	case content.Kind == yaml.MappingNode:
		return rawSourceContent(data, i)
	default:
		d.errorAt(cpath, content.Line, "expected the hooks.json document as a JSON string or object, got %s", describe(content))
	}
	return nil
}

// rawSourceContent returns the bytes of sources[i].content as written.
// The document is known to be valid JSON with an object there.
func rawSourceContent(data []byte, i int) json.RawMessage {
	var env struct {
		Sources []struct {
			Content json.RawMessage `json:"content"`
		} `json:"sources"`
	}
	_ = json.Unmarshal(data, &env) // type errors elsewhere in sources do not matter
	if i >= len(env.Sources) {
		return nil
	}
	return slices.Clone(env.Sources[i].Content)
}

// nodeJSON re-encodes a decoded mapping as JSON (keys sorted, duplicates gone):
// hooks.json carried inside a sandbox spec, whose text is not the document's own.
func nodeJSON(n *yaml.Node) json.RawMessage {
	var v any
	if n.Decode(&v) != nil {
		return nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	return data
}

// mappingValue returns the value of key in mapping n (the last one when
// repeated, as encoding/json does).
func mappingValue(n *yaml.Node, key string) (*yaml.Node, bool) {
	var v *yaml.Node
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Kind == yaml.ScalarNode && n.Content[i].Value == key {
				v = n.Content[i+1]
			}
		}
	}
	return v, v != nil
}

// keyLine returns the line of key in mapping n.
func keyLine(n *yaml.Node, key string) int {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i].Line
		}
	}
	return n.Line
}

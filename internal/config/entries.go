package config

import (
	"errors"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/egressd/egressd/internal/allowlist"
)

// This file decodes allowlist entries, the same way whether they come from
// the policy JSON or inline from YAML, and compiles them.

// rawAllowlist is a decoded allowlist: one allowlist.Entry per item, as far
// as the item decoded.
type rawAllowlist struct {
	entries  []allowlist.Entry
	disabled bool // "disabled": empty on purpose, no warning
}

func (a *rawAllowlist) decodeNode(d *decoder, n *yaml.Node, path string) {
	items, ok := d.list(n, path)
	if !ok {
		return
	}
	a.entries = make([]allowlist.Entry, len(items))
	for i, item := range items {
		ip := indexPath(path, i)
		d.ps.setLine(ip, item.Line)
		a.entries[i] = decodeEntry(d, item, ip)
	}
}

// decodeEntry decodes one entry; the problems it finds are recorded, and
// the entry holds what did decode.
func decodeEntry(d *decoder, n *yaml.Node, path string) allowlist.Entry {
	if n = d.deref(n); n.Kind != yaml.MappingNode {
		d.errorAt(path, n.Line, `expected an entry such as {"domain": "github.com"}, got %s`, describe(n))
		return allowlist.Entry{}
	}
	var r rawEntry
	d.decode(n, reflect.ValueOf(&r).Elem(), path)
	e := allowlist.Entry{
		Transform:      r.Transform.headers,
		Credential:     r.Credential,
		AllowPlaintext: r.AllowPlaintext,
		GitHub:         r.GitHub,
	}
	if r.AWS != nil {
		e.AWS = &allowlist.AWSScope{Regions: r.AWS.Regions, Services: r.AWS.Services}
	}
	if r.Domain == nil {
		d.ps.errorf(path+".domain", `required, e.g. "domain": "api.example.com"`)
	} else {
		e.Domain = *r.Domain
	}
	if r.Ports != nil {
		v := validator{ps: d.ps}
		e.Ports, _ = v.ports(r.Ports, path+".ports")
	}
	return e
}

// rawTransform is an entry's header map, or a list of header maps merged
// in order. A header name may appear once, in any case.
type rawTransform struct {
	headers []allowlist.Header
}

func (t *rawTransform) decodeNode(d *decoder, n *yaml.Node, path string) {
	seen := map[string]string{} // lower-case name -> path that set it
	switch n = d.deref(n); n.Kind {
	case yaml.MappingNode:
		t.add(d, n, path, seen)
	case yaml.SequenceNode:
		for i, item := range n.Content {
			ip := indexPath(path, i)
			d.ps.setLine(ip, item.Line)
			if item = d.deref(item); item.Kind != yaml.MappingNode {
				d.errorAt(ip, item.Line, "expected a mapping of header names to values, got %s", describe(item))
				continue
			}
			t.add(d, item, ip, seen)
		}
	default:
		d.errorAt(path, n.Line, "expected a mapping of header names to values (or a list of them), got %s", describe(n))
	}
}

// add appends the headers of one mapping, refusing names set before.
func (t *rawTransform) add(d *decoder, n *yaml.Node, path string, seen map[string]string) {
	d.eachKey(n, path, func(name string, k, val *yaml.Node, kpath string) {
		if !d.charge(kpath, k.Line) {
			return
		}
		value, ok := d.str(val, kpath)
		if !ok {
			return
		}
		lower := strings.ToLower(name)
		if first, dup := seen[lower]; dup {
			d.errorAt(kpath, k.Line, "header %s is already set by %s", quoteShort(name), first)
			return
		}
		seen[lower] = kpath
		t.headers = append(t.headers, allowlist.Header{Name: name, Value: value})
	})
}

// compileAllowlist compiles the decoded entries with opts, reporting each
// allowlist.EntryError at "<prefix>[i].<field>" (an option's error at its
// config path). An entry error is left out
// when decoding already reported a problem at, above or under its path:
// the decoder's message is the more precise one. The entries are returned
// as parsed whatever happens, for explain and check.
func compileAllowlist(a *rawAllowlist, prefix string, opts allowlist.Options, ps *problems) (*allowlist.Policy, []allowlist.Entry) {
	if len(a.entries) == 0 && !a.disabled && !ps.hasError(prefix, true) {
		ps.warnf(prefix, "empty: every destination is denied")
	}
	pol, err := allowlist.Compile(a.entries, opts)
	var ce *allowlist.CompileError
	switch {
	case errors.As(err, &ce):
		for _, ee := range ce.Problems {
			path := ee.Field // Index -1: an option, named by its config path
			if ee.Index >= 0 {
				path = indexPath(prefix, ee.Index)
				if ee.Field != "" {
					path = joinPath(path, ee.Field)
				}
			}
			if !ps.hasError(path, true) {
				ps.errorf(path, "%s", ee.Msg)
			}
		}
	case err != nil:
		ps.errorf(prefix, "%v", err)
	}
	return pol, a.entries
}

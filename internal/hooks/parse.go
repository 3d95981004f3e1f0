package hooks

import (
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/jsonnode"
)

// ParseError lists every problem Parse found, each with its JSON path.
type ParseError struct {
	Problems []Finding // all of SeverityError
}

// Error renders "invalid hooks.json:" and one indented line per problem.
func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString("invalid hooks.json:")
	for _, p := range e.Problems {
		b.WriteString("\n  " + p.String())
	}
	return b.String()
}

// Parse reads hooks.json: an object of group name -> {enabled, pre_tool_execution,
// post_tool_execution}; each event a list of {matcher, hooks}; each hook {type,
// command | url, headers, timeout}. It is strict about the types of the keys it knows
// and every problem is reported at once, with its path, as a *ParseError; unknown keys
// are recorded in File.Unknown, not refused, since the runtime's format may grow. A
// null event is an empty one.
func Parse(data []byte) (*File, error) {
	root, err := jsonnode.Parse(data, jsonnode.Options{MaxDepth: maxDepth})
	if err != nil {
		return nil, &ParseError{Problems: []Finding{{Severity: SeverityError, Msg: "not a JSON document: " + err.Error()}}}
	}
	p := &parser{}
	f := p.file(root)
	if len(p.problems) > 0 {
		return nil, &ParseError{Problems: p.problems}
	}
	return f, nil
}

// parser collects problems and unknown keys while walking the document.
type parser struct {
	problems []Finding
	unknown  []string
}

func (p *parser) errorf(path, format string, args ...any) {
	p.problems = append(p.problems, Finding{Path: path, Severity: SeverityError, Msg: fmt.Sprintf(format, args...)})
}

// want reports whether n has kind k, recording a problem when it has not.
func (p *parser) want(n *jsonnode.Node, k jsonnode.Kind, path, what string) bool {
	if n.Kind == k {
		return true
	}
	p.errorf(path, "expected %s, got %s", what, n.Kind)
	return false
}

// fields walks an object's keys, calling known for the keys it handles and recording
// the others as unknown.
func (p *parser) fields(n *jsonnode.Node, path string, known map[string]func(v *jsonnode.Node, path string)) {
	for _, m := range n.Unique() {
		if k := m.Key.Str; known[k] != nil {
			known[k](m.Value, keyPath(path, k))
		} else {
			p.unknown = append(p.unknown, keyPath(path, k))
		}
	}
}

func (p *parser) file(root *jsonnode.Node) *File {
	f := &File{}
	if !p.want(root, jsonnode.Object, "", `an object of group name -> {"pre_tool_execution": [...], ...}`) {
		return f
	}
	for _, m := range root.Unique() {
		if g, ok := p.group(m.Key.Str, m.Value, keyPath("", m.Key.Str)); ok {
			f.Groups = append(f.Groups, g)
		}
	}
	f.Unknown = p.unknown
	return f
}

func (p *parser) group(name string, n *jsonnode.Node, path string) (Group, bool) {
	g := Group{Name: name, Path: path, Enabled: true}
	if !p.want(n, jsonnode.Object, path, `a group {"pre_tool_execution": [...], "post_tool_execution": [...]}`) {
		return g, false
	}
	known := map[string]func(*jsonnode.Node, string){
		"enabled": func(v *jsonnode.Node, vp string) {
			if p.want(v, jsonnode.Bool, vp, "true or false") {
				g.Enabled = v.Bool
			}
		},
		EventPre:  func(v *jsonnode.Node, vp string) { g.Pre = p.rules(v, vp) },
		EventPost: func(v *jsonnode.Node, vp string) { g.Post = p.rules(v, vp) },
	}
	for _, m := range n.Unique() {
		k, kp := m.Key.Str, keyPath(path, m.Key.Str)
		if f, ok := known[k]; ok {
			f(m.Value, kp)
			continue
		}
		// Read leniently, for the lint only: its own problems are not the file's.
		p.unknown = append(p.unknown, kp)
		stray := &parser{}
		g.Stray = append(g.Stray, StrayKey{Name: k, Path: kp, Rules: stray.rules(m.Value, kp)})
	}
	return g, true
}

func (p *parser) rules(n *jsonnode.Node, path string) []Rule {
	if n.Kind == jsonnode.Null || !p.want(n, jsonnode.Array, path, `a list of {"matcher": ..., "hooks": [...]}`) {
		return nil
	}
	var rules []Rule
	for i, item := range n.Elems {
		rp := indexPath(path, i)
		if !p.want(item, jsonnode.Object, rp, `a rule {"matcher": ..., "hooks": [...]}`) {
			continue
		}
		r := Rule{Path: rp}
		hasHooks := false
		p.fields(item, rp, map[string]func(*jsonnode.Node, string){
			"matcher": func(v *jsonnode.Node, vp string) {
				if p.want(v, jsonnode.String, vp, "a string (an RE2 pattern, or \"*\" for every built-in tool)") {
					r.Matcher = v.Str
				}
			},
			"hooks": func(v *jsonnode.Node, vp string) { hasHooks, r.Hooks = true, p.hooks(v, vp) },
		})
		if !hasHooks {
			p.errorf(keyPath(rp, "hooks"), `required: the list of hooks to run, e.g. [{"type": "http", "url": "https://..."}]`)
		}
		rules = append(rules, r)
	}
	return rules
}

func (p *parser) hooks(n *jsonnode.Node, path string) []Hook {
	if !p.want(n, jsonnode.Array, path, `a list of hooks {"type": "http", "url": ...}`) {
		return nil
	}
	var hooks []Hook
	for i, item := range n.Elems {
		hp := indexPath(path, i)
		if p.want(item, jsonnode.Object, hp, `a hook {"type": "http", "url": ...} or {"type": "command", "command": ...}`) {
			hooks = append(hooks, p.hook(item, hp))
		}
	}
	return hooks
}

func (p *parser) hook(n *jsonnode.Node, path string) Hook {
	h := Hook{Path: path, Timeout: DefaultTimeout}
	str := func(dst *string) func(*jsonnode.Node, string) {
		return func(v *jsonnode.Node, vp string) {
			if p.want(v, jsonnode.String, vp, "a string") {
				*dst = v.Str
			}
		}
	}
	p.fields(n, path, map[string]func(*jsonnode.Node, string){
		"type":    str(&h.Type),
		"command": str(&h.Command),
		"url":     str(&h.URL),
		"headers": func(v *jsonnode.Node, vp string) { h.Headers = p.headers(v, vp) },
		"timeout": func(v *jsonnode.Node, vp string) { h.Timeout, h.TimeoutSet = p.timeout(v, vp), true },
	})
	switch h.Type {
	case TypeCommand:
		if h.Command == "" {
			p.errorf(keyPath(path, "command"), "required for a command hook: the command to run")
		}
	case TypeHTTP:
		p.target(&h, keyPath(path, "url"))
	case "":
		if _, ok := n.Get("type"); !ok {
			p.errorf(keyPath(path, "type"), `required: "http" or "command"`)
		}
	default:
		p.errorf(keyPath(path, "type"), `unknown hook type %q; use "http" or "command"`, h.Type)
	}
	return h
}

func (p *parser) headers(n *jsonnode.Node, path string) []Header {
	if !p.want(n, jsonnode.Object, path, `an object of header name -> value`) {
		return nil
	}
	var hs []Header
	for _, m := range n.Unique() {
		if k, v := m.Key.Str, m.Value; p.want(v, jsonnode.String, keyPath(path, k), "a string") {
			hs = append(hs, Header{Name: k, Value: v.Str})
		}
	}
	return hs
}

// timeout reads a positive number of seconds.
func (p *parser) timeout(n *jsonnode.Node, path string) time.Duration {
	if !p.want(n, jsonnode.Number, path, "a number of seconds") {
		return DefaultTimeout
	}
	s, err := n.Num.Float64()
	switch {
	case err != nil || math.IsNaN(s) || s <= 0:
		p.errorf(path, "must be a positive number of seconds, got %s", n.Num)
		return DefaultTimeout
	case s > maxTimeout.Seconds():
		p.errorf(path, "%s seconds is more than %s; the timeout is in seconds", n.Num, maxTimeout)
		return DefaultTimeout
	}
	return time.Duration(s * float64(time.Second))
}

// target parses an http hook's URL into the fields Index compares.
func (p *parser) target(h *Hook, path string) {
	if h.URL == "" {
		p.errorf(path, "required for an http hook: the endpoint's https:// URL")
		return
	}
	u, err := url.Parse(h.URL)
	if err != nil {
		p.errorf(path, "not a URL: %v", err)
		return
	}
	h.Scheme = strings.ToLower(u.Scheme)
	if h.Scheme != "http" && h.Scheme != "https" || u.Host == "" {
		p.errorf(path, "%q is not an absolute http:// or https:// URL", h.URL)
		return
	}
	t, err := allowlist.ParseAuthority(u.Host, defaultPort(h.Scheme))
	if err != nil {
		p.errorf(path, "bad host: %v", err)
		return
	}
	h.Target, h.PPath = t, NormalizePath(u.EscapedPath())
}

// defaultPort is the port of an http:// or https:// URL that names none.
func defaultPort(scheme string) uint16 {
	port, _ := allowlist.SchemePort(scheme)
	return port
}

// maxDepth bounds nesting; hooks.json needs five levels.
const maxDepth = 64

// plainKey is a key that needs no quoting in a path.
var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// keyPath appends an object key to a JSON path: a.b, or a["odd key"].
func keyPath(path, key string) string {
	switch {
	case !plainKey.MatchString(key):
		return path + "[" + strconv.Quote(key) + "]"
	case path == "":
		return key
	}
	return path + "." + key
}

// indexPath appends a list index to a JSON path.
func indexPath(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

package config

import (
	"bytes"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"
)

// This file is the strict decoder. yaml.v3's KnownFields stops at the first
// unknown key and its type errors carry a line but no path, so instead the
// document is parsed into a yaml.Node tree and walked against the raw
// structs' yaml tags by reflection. The walk records every unknown key
// (with a suggestion), duplicate key and type mismatch with its path and
// line, keeps going, and fills in whatever did decode. It also records the
// line of every path it visits, for the semantic checks in validate.go.
//
// Leaves are stricter than yaml.v3: a string field takes only a string
// (not 8080 or true), a bool only true or false (not "yes"), so JSON and
// YAML mean the same thing.

// nodeDecoder is implemented by raw types that decode themselves
// (durations, transforms, allowlists). decodeNode is never called with a
// null node: null always means absent.
type nodeDecoder interface {
	decodeNode(d *decoder, n *yaml.Node, path string)
}

// decoder walks one document. ps collects problems; expanding guards
// against alias cycles; budget bounds the nodes visited, so that aliases
// cannot expand a small document into a huge one.
type decoder struct {
	ps        *problems
	expanding map[*yaml.Node]bool
	budget    int
}

func newDecoder(ps *problems) *decoder {
	return &decoder{ps: ps, expanding: map[*yaml.Node]bool{}, budget: maxNodes}
}

// decode fills v (addressable) from n, recording problems under path.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if !d.charge(path, n.Line) {
		return
	}
	if n.Kind == yaml.AliasNode {
		d.alias(n, v, path)
		return
	}
	if isNull(n) {
		return
	}
	if nd, ok := v.Addr().Interface().(nodeDecoder); ok {
		nd.decodeNode(d, n, path)
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		// A pointer marks a key as present; a scalar that failed to decode
		// stays absent, so validation does not report it a second time.
		e, before := reflect.New(v.Type().Elem()), d.ps.count()
		d.decode(n, e.Elem(), path)
		if d.ps.count() == before || e.Elem().Kind() == reflect.Struct {
			v.Set(e)
		}
	case reflect.Struct:
		d.mapping(n, v, path)
	case reflect.Slice:
		d.sequence(n, v, path)
	case reflect.String:
		if s, ok := d.str(n, path); ok {
			v.SetString(s)
		}
	case reflect.Int, reflect.Int64, reflect.Uint32:
		d.integer(n, v, path)
	case reflect.Bool:
		d.boolean(n, v, path)
	default:
		panic("config: no decoder for " + v.Type().String())
	}
}

// charge spends one node of the budget, reporting once when it runs out.
func (d *decoder) charge(path string, line int) bool {
	if d.budget--; d.budget == 0 {
		d.errorAt(path, line, "document too large (too many nodes or aliases)")
	}
	return d.budget > 0
}

// alias decodes the node an alias refers to, refusing cycles.
func (d *decoder) alias(n *yaml.Node, v reflect.Value, path string) {
	if n.Alias == nil || d.expanding[n] {
		d.errorAt(path, n.Line, "alias *%s refers to itself", n.Value)
		return
	}
	d.expanding[n] = true
	defer delete(d.expanding, n)
	d.decode(n.Alias, v, path)
}

// mapping decodes a struct from a mapping, key by key.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) {
	if n = d.deref(n); n.Kind != yaml.MappingNode {
		d.errorAt(path, n.Line, "expected a mapping, got %s", describe(n))
		return
	}
	fields := fieldsOf(v.Type())
	present, suggested := map[string]bool{}, []string{}
	d.eachKey(n, path, func(key string, k, val *yaml.Node, kpath string) {
		i, ok := fields.index[key]
		if !ok {
			suggested = append(suggested, Suggest(key, fields.names))
			d.errorAt(kpath, k.Line, "%s", unknownKey(key, fields.names))
			return
		}
		present[key] = true
		d.decode(val, v.Field(i), kpath)
	})
	// A misspelt key's suggestion explains why the key it names is
	// missing; validation then does not also call it required.
	for _, s := range suggested {
		if s != "" && !present[s] {
			d.ps.suggested[joinPath(path, s)] = true
		}
	}
}

// eachKey calls fn for every key of mapping n that is a string and not a
// duplicate, recording the key's line; it reports the others.
func (d *decoder) eachKey(n *yaml.Node, path string, fn func(key string, k, val *yaml.Node, kpath string)) {
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := d.deref(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
			d.errorAt(path, k.Line, "keys must be plain strings (merge keys and complex keys are not supported)")
			continue
		}
		kpath := joinPath(path, k.Value)
		if seen[k.Value] {
			d.errorAt(kpath, k.Line, "duplicate key")
			continue
		}
		seen[k.Value] = true
		d.ps.setLine(kpath, k.Line)
		fn(k.Value, k, val, kpath)
	}
}

// sequence decodes a slice from a list, item by item.
func (d *decoder) sequence(n *yaml.Node, v reflect.Value, path string) {
	items, ok := d.list(n, path)
	if !ok {
		return
	}
	s := reflect.MakeSlice(v.Type(), len(items), len(items))
	for i, item := range items {
		ip := indexPath(path, i)
		d.ps.setLine(ip, item.Line)
		d.decode(item, s.Index(i), ip)
	}
	v.Set(s)
}

// list returns the items of a sequence node, or reports that n is not one.
func (d *decoder) list(n *yaml.Node, path string) ([]*yaml.Node, bool) {
	if n = d.deref(n); n.Kind != yaml.SequenceNode {
		d.errorAt(path, n.Line, "expected a list, got %s", describe(n))
		return nil, false
	}
	return n.Content, true
}

// str returns the value of a string scalar.
func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	if n = d.deref(n); n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		hint := ""
		if n.Kind == yaml.ScalarNode && !isNull(n) {
			hint = " (quote it if you mean the string)"
		}
		d.errorAt(path, n.Line, "expected a string, got %s%s", describe(n), hint)
		return "", false
	}
	return n.Value, true
}

// scalar returns the text of any scalar (durations accept 10s and "10s").
func (d *decoder) scalar(n *yaml.Node, path, want string) (string, bool) {
	if n = d.deref(n); n.Kind != yaml.ScalarNode {
		d.errorAt(path, n.Line, "expected %s, got %s", want, describe(n))
		return "", false
	}
	return n.Value, true
}

func (d *decoder) integer(n *yaml.Node, v reflect.Value, path string) {
	n = d.deref(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(v.Addr().Interface()) != nil {
		d.errorAt(path, n.Line, "expected an integer, got %s", describe(n))
	}
}

func (d *decoder) boolean(n *yaml.Node, v reflect.Value, path string) {
	n = d.deref(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(v.Addr().Interface()) != nil {
		d.errorAt(path, n.Line, "expected true or false, got %s", describe(n))
	}
}

// deref follows an alias one level for the shape checks above (decode has
// already refused cycles for the node itself).
func (d *decoder) deref(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil && n.Alias.Kind != yaml.AliasNode {
		return n.Alias
	}
	return n
}

// errorAt records an error at path on a known line, and remembers the
// line for later checks on the same path.
func (d *decoder) errorAt(path string, line int, format string, args ...any) {
	d.ps.setLine(path, line)
	d.ps.add(Problem{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)})
}

// isNull reports whether n is an explicit or implicit null (`key:`).
func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names what a node is, for "expected X, got Y".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str":
			return "the string " + quoteShort(n.Value)
		case "!!null":
			return "null"
		}
		if q := quoteShort(n.Value); q[1:len(q)-1] == n.Value {
			return n.Value // a number or boolean, shown as written
		}
		return quoteShort(n.Value)
	}
	return "nothing"
}

// quoteShort quotes s, cut to 40 runes, so messages stay one short line.
func quoteShort(s string) string {
	if r := []rune(s); len(r) > 40 {
		s = string(r[:40]) + "..."
	}
	return strconv.Quote(s)
}

// plainKey matches keys that need no quoting in a path.
var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// joinPath appends a key: "listeners[1]" + "address". Keys that are not
// plain words are quoted, so a path is always one readable line.
func joinPath(path, key string) string {
	if !plainKey.MatchString(key) {
		key = quoteShort(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// indexPath appends a list index: "listeners" + 1 = "listeners[1]".
func indexPath(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

// structFields maps a raw struct's yaml tag names to field indexes.
type structFields struct {
	index map[string]int
	names []string // in declaration order, for messages
}

var fieldCache sync.Map // reflect.Type -> *structFields

// fieldsOf reads the yaml tags of struct type t, once.
func fieldsOf(t reflect.Type) *structFields {
	if f, ok := fieldCache.Load(t); ok {
		return f.(*structFields)
	}
	f := &structFields{index: map[string]int{}}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		f.index[name] = i
		f.names = append(f.names, name)
	}
	fieldCache.Store(t, f)
	return f
}

// unknownKey is the message for key, with the closest known key as a
// suggestion when one is near enough, else the list of known keys.
func unknownKey(key string, known []string) string {
	if s := Suggest(key, known); s != "" {
		return fmt.Sprintf("unknown key; did you mean %q?", s)
	}
	return "unknown key; expected one of " + strings.Join(known, ", ")
}

// Suggest returns the known key closest to key (case-insensitively) within
// maxSuggestDistance edits, the first on ties; "" if none. The "did you mean"
// of every unknown key egressd reports, in egressd.yaml and in hooks.json.
func Suggest(key string, known []string) string {
	best, bestDist := "", maxSuggestDistance+1
	lk := strings.ToLower(key)
	for _, k := range known {
		if d := editDistance(lk, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	if len(ra) > 64 || len(rb) > 64 {
		return len(ra) + len(rb) // far apart; and bounds the work
	}
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// yamlLine matches yaml.v3's syntax errors, "yaml: line 3: ...".
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// decodeConfig parses one YAML document into a rawConfig, recording every
// problem. ok is false when the document could not be read as a mapping
// at all; validation would then only add noise.
func decodeConfig(data []byte, ps *problems) (raw *rawConfig, ok bool) {
	root, err := parseYAML(data)
	if err != nil {
		ps.add(yamlProblem(err))
		return nil, false
	}
	raw = &rawConfig{}
	if root == nil {
		return raw, true // empty: validation reports what is missing
	}
	if root.Kind != yaml.MappingNode {
		ps.add(Problem{Line: root.Line, Msg: "the config must be a YAML mapping, starting with version: 1; got " + describe(root)})
		return nil, false
	}
	newDecoder(ps).decode(root, reflect.ValueOf(raw).Elem(), "")
	return raw, true
}

// parseYAML returns the root node of the single document in data (nil for
// an empty one). yaml.v3 is defended against its own panics, so that no
// input can crash a reload.
func parseYAML(data []byte) (root *yaml.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			root, err = nil, fmt.Errorf("yaml: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err == io.EOF {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("yaml: line %d: a second document starts here; egressd reads one document per file", extra.Line)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	return doc.Content[0], nil
}

// yamlProblem turns a yaml.v3 syntax error into a Problem with its line.
func yamlProblem(err error) Problem {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return Problem{Line: line, Msg: "invalid YAML: " + m[2]}
	}
	return Problem{Msg: "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

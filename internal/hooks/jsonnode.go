package hooks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
)

// node is a decoded JSON value that keeps the order of object keys, so that findings and
// index precedence follow the document.
type node struct {
	kind kind
	keys []string // object keys, in order (a repeated key keeps its last value, like encoding/json)
	vals map[string]*node
	arr  []*node
	str  string
	num  json.Number
	b    bool
}

type kind int

const (
	kNull kind = iota
	kBool
	kNumber
	kString
	kArray
	kObject
)

// maxDepth bounds nesting; hooks.json needs five levels.
const maxDepth = 64

func (k kind) String() string {
	return [...]string{"null", "a boolean", "a number", "a string", "a list", "an object"}[k]
}

// parseJSON decodes one JSON document, refusing trailing data.
func parseJSON(data []byte) (*node, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	n, err := decodeNode(d, 0)
	if err != nil {
		return nil, &offsetError{err: err, off: d.InputOffset()}
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return nil, &offsetError{err: errors.New("data after the JSON document"), off: d.InputOffset()}
	}
	return n, nil
}

// offsetError is a JSON error with the input offset where decoding stopped, for
// errors that carry none of their own.
type offsetError struct {
	err error
	off int64
}

func (e *offsetError) Error() string { return e.err.Error() }
func (e *offsetError) Unwrap() error { return e.err }

func decodeNode(d *json.Decoder, depth int) (*node, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", maxDepth)
	}
	tok, err := d.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("unexpected end of JSON input")
		}
		return nil, err
	}
	switch t := tok.(type) {
	case nil:
		return &node{kind: kNull}, nil
	case bool:
		return &node{kind: kBool, b: t}, nil
	case json.Number:
		return &node{kind: kNumber, num: t}, nil
	case string:
		return &node{kind: kString, str: t}, nil
	case json.Delim:
		if t == '[' {
			return decodeArray(d, depth)
		}
		return decodeObject(d, depth)
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}

func decodeArray(d *json.Decoder, depth int) (*node, error) {
	n := &node{kind: kArray}
	for d.More() {
		v, err := decodeNode(d, depth+1)
		if err != nil {
			return nil, err
		}
		n.arr = append(n.arr, v)
	}
	_, err := d.Token() // ']'
	return n, err
}

func decodeObject(d *json.Decoder, depth int) (*node, error) {
	n := &node{kind: kObject, vals: map[string]*node{}}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, err
		}
		k := tok.(string) // the decoder guarantees a string key here
		v, err := decodeNode(d, depth+1)
		if err != nil {
			return nil, err
		}
		if _, dup := n.vals[k]; !dup {
			n.keys = append(n.keys, k)
		}
		n.vals[k] = v
	}
	_, err := d.Token() // '}'
	return n, err
}

// get returns the value of key in an object node.
func (n *node) get(key string) (*node, bool) {
	v, ok := n.vals[key]
	return v, ok
}

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

package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"

	"gopkg.in/yaml.v3"
)

// The policy is JSON, but its problems should read like the config's: with
// paths, lines, unknown keys and duplicate keys. So the JSON is turned into
// the same yaml.Node tree the YAML decoder walks, with each node's line and
// column. encoding/json alone would drop duplicate keys silently and give
// byte offsets only.

// jsonSyntaxError is a JSON syntax error at a line and column.
type jsonSyntaxError struct {
	line, col int
	msg       string
}

func (e *jsonSyntaxError) Error() string {
	return fmt.Sprintf("line %d, column %d: %s", e.line, e.col, e.msg)
}

// jsonProblem is the Problem for a parseJSON error.
func jsonProblem(err error) Problem {
	var se *jsonSyntaxError
	if errors.As(err, &se) {
		return Problem{Path: "policy", Line: se.line, Column: se.col, Msg: "invalid JSON: " + se.msg}
	}
	return Problem{Path: "policy", Msg: "invalid JSON: " + err.Error()}
}

// utf8BOM is skipped at the start of a JSON document; some editors write it.
var utf8BOM = []byte("\xef\xbb\xbf")

// parseJSON parses data, one JSON value, into a node tree: objects become
// mappings (keys in order, duplicates kept), arrays sequences, strings
// !!str scalars (quoted, so never re-read as numbers or booleans), numbers
// !!int or !!float, true/false !!bool, null !!null.
func parseJSON(data []byte) (*yaml.Node, error) {
	data = bytes.TrimPrefix(data, utf8BOM)
	pos := newPositions(data)
	if err := json.Unmarshal(data, new(json.RawMessage)); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line, col := pos.at(int(se.Offset))
			return nil, &jsonSyntaxError{line: line, col: col, msg: se.Error()}
		}
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	b := &jsonBuilder{dec: dec, pos: pos}
	return b.value()
}

// jsonBuilder builds nodes from the token stream of valid JSON.
type jsonBuilder struct {
	dec *json.Decoder
	pos positions
}

// next returns the next token and the line and column of its last byte.
func (b *jsonBuilder) next() (json.Token, int, int, error) {
	tok, err := b.dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, 0, 0, err
	}
	line, col := b.pos.at(int(b.dec.InputOffset()) - 1)
	return tok, line, col, nil
}

func (b *jsonBuilder) value() (*yaml.Node, error) {
	tok, line, col, err := b.next()
	if err != nil {
		return nil, err
	}
	n := &yaml.Node{Line: line, Column: col}
	switch t := tok.(type) {
	case json.Delim:
		n.Kind = yaml.SequenceNode
		n.Tag = "!!seq"
		if t == '{' {
			n.Kind = yaml.MappingNode
			n.Tag = "!!map"
		}
		return n, b.children(n)
	case string:
		n.Kind, n.Tag, n.Value, n.Style = yaml.ScalarNode, "!!str", t, yaml.DoubleQuotedStyle
	case json.Number:
		n.Kind, n.Tag, n.Value = yaml.ScalarNode, "!!float", t.String()
		if _, err := strconv.ParseInt(t.String(), 10, 64); err == nil {
			n.Tag = "!!int"
		}
	case bool:
		n.Kind, n.Tag, n.Value = yaml.ScalarNode, "!!bool", strconv.FormatBool(t)
	case nil:
		n.Kind, n.Tag, n.Value = yaml.ScalarNode, "!!null", "null"
	}
	return n, nil
}

// children reads the members of an object or array up to its closing
// delimiter.
func (b *jsonBuilder) children(n *yaml.Node) error {
	for b.dec.More() {
		if n.Kind == yaml.MappingNode {
			key, err := b.value()
			if err != nil {
				return err
			}
			n.Content = append(n.Content, key)
		}
		v, err := b.value()
		if err != nil {
			return err
		}
		n.Content = append(n.Content, v)
	}
	_, _, _, err := b.next() // the closing delimiter
	return err
}

// positions maps byte offsets to lines and columns.
type positions struct {
	newlines []int // offsets of '\n'
}

func newPositions(data []byte) positions {
	var p positions
	for i, c := range data {
		if c == '\n' {
			p.newlines = append(p.newlines, i)
		}
	}
	return p
}

// JSONPosition returns the 1-based line and column (in bytes) of byte offset off
// in data: where a *json.SyntaxError's Offset points, for every JSON file egressd
// reads (the policy, hooks.json, the credentials file).
func JSONPosition(data []byte, off int64) (line, col int) {
	return newPositions(data).at(int(off))
}

// at returns the 1-based line and column (in bytes) of offset off.
func (p positions) at(off int) (line, col int) {
	off = max(off, 0)
	k := sort.SearchInts(p.newlines, off) // newlines before off
	start := 0
	if k > 0 {
		start = p.newlines[k-1] + 1
	}
	return k + 1, off - start + 1
}

// readFile reads a config or policy file: a regular file (never a FIFO or
// device, which could block or never end) of at most maxFileBytes.
func readFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > maxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d MiB", path, maxFileBytes>>20)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err == nil && len(data) > maxFileBytes {
		err = fmt.Errorf("%s is larger than %d MiB", path, maxFileBytes>>20)
	}
	return data, err
}

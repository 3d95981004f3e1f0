package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/egressd/egressd/internal/jsonnode"
)

// The policy is JSON, but its problems should read like the config's: with
// paths, lines, unknown keys and duplicate keys. So the JSON is read by
// jsonnode (keys in order, duplicates kept, lines and columns) and turned into
// the same yaml.Node tree the YAML decoder walks.

// jsonProblem is the Problem for a parseJSON error.
func jsonProblem(err error) Problem {
	var se *jsonnode.SyntaxError
	if errors.As(err, &se) {
		return Problem{Path: "policy", Line: se.Line, Column: se.Column, Msg: "invalid JSON: " + se.Msg}
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
	n, err := jsonnode.Parse(bytes.TrimPrefix(data, utf8BOM), jsonnode.Options{})
	if err != nil {
		return nil, err
	}
	return yamlNode(n), nil
}

// yamlNode is the yaml.Node for a JSON node.
func yamlNode(j *jsonnode.Node) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Line: j.Line, Column: j.Column}
	switch j.Kind {
	case jsonnode.Object:
		n.Kind, n.Tag = yaml.MappingNode, "!!map"
		for _, m := range j.Members {
			n.Content = append(n.Content, yamlNode(m.Key), yamlNode(m.Value))
		}
	case jsonnode.Array:
		n.Kind, n.Tag = yaml.SequenceNode, "!!seq"
		for _, e := range j.Elems {
			n.Content = append(n.Content, yamlNode(e))
		}
	case jsonnode.String:
		n.Tag, n.Value, n.Style = "!!str", j.Str, yaml.DoubleQuotedStyle
	case jsonnode.Number:
		n.Tag, n.Value = "!!float", j.Num.String()
		if _, err := strconv.ParseInt(n.Value, 10, 64); err == nil {
			n.Tag = "!!int"
		}
	case jsonnode.Bool:
		n.Tag, n.Value = "!!bool", strconv.FormatBool(j.Bool)
	case jsonnode.Null:
		n.Tag, n.Value = "!!null", "null"
	}
	return n
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

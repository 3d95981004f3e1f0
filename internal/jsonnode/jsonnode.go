// Package jsonnode reads one JSON document into a tree that keeps object members in order, duplicates included, with each value's line and column.
package jsonnode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
)

// Why not encoding/json alone: it drops duplicate keys silently, forgets key order and gives byte
// offsets only. The tree is built from json.Decoder's token stream; when that fails, the document
// is read again by json.Decoder.Decode for the error, since Token's offset for an error inside a
// scalar is wrong.

// Kind is the JSON type of a node.
type Kind int

// The kinds of JSON value.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

// String names the kind as a message reads it: "a number", "an object".
func (k Kind) String() string {
	return [...]string{"null", "a boolean", "a number", "a string", "a list", "an object"}[k]
}

// Node is one JSON value.
type Node struct {
	Kind Kind
	// Line and Column (1-based, in bytes) locate the value: its opening delimiter, or a
	// scalar's last byte.
	Line, Column int
	Str          string      // String
	Num          json.Number // Number
	Bool         bool        // Bool
	Elems        []*Node     // Array
	Members      []Member    // Object: every member in document order, a repeated key each time
}

// Member is one key: value pair of an object; Key is a String node.
type Member struct {
	Key, Value *Node
}

// Unique returns an object's members with one per key, in the order the keys first appear, each
// holding the value of the key's last occurrence: what encoding/json would keep.
func (n *Node) Unique() []Member {
	at := make(map[string]int, len(n.Members))
	var out []Member
	for _, m := range n.Members {
		if i, dup := at[m.Key.Str]; dup {
			out[i].Value = m.Value
			continue
		}
		at[m.Key.Str] = len(out)
		out = append(out, m)
	}
	return out
}

// Get returns the value of the last member named key of an object.
func (n *Node) Get(key string) (*Node, bool) {
	for i := len(n.Members) - 1; i >= 0; i-- {
		if n.Members[i].Key.Str == key {
			return n.Members[i].Value, true
		}
	}
	return nil, false
}

// Options are a caller's limits; the zero value has none beyond encoding/json's own.
type Options struct {
	// MaxDepth, when positive, refuses a document with a value nested more than MaxDepth
	// levels below the root.
	MaxDepth int
}

// SyntaxError is a document that is not one JSON value, or nested too deep.
type SyntaxError struct {
	Msg string
	// Offset is the byte the error is at (the offending byte, or len(data) when the input ends
	// early); Line and Column (1-based, in bytes) are where Offset is.
	Offset       int64
	Line, Column int
}

// Error renders "msg (line L, column C)".
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("%s (line %d, column %d)", e.Msg, e.Line, e.Column)
}

// Parse reads data, one JSON value with nothing after it but white space. Every error is a
// *SyntaxError.
func Parse(data []byte, opts Options) (*Node, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	b := &builder{dec: dec, pos: newPositions(data), maxDepth: opts.MaxDepth}
	n, err := b.value(0)
	if err == nil {
		err = trailing(data, dec.InputOffset())
	}
	if err == nil {
		return n, nil
	}
	var se *SyntaxError
	if !errors.As(err, &se) {
		se = decodeError(data, dec.InputOffset(), err)
	}
	se.Line, se.Column = b.pos.at(int(se.Offset))
	return nil, se
}

// trailing refuses anything but white space after the document, which ends at off.
func trailing(data []byte, off int64) error {
	for off < int64(len(data)) && isSpace(data[off]) {
		off++
	}
	if off < int64(len(data)) {
		return &SyntaxError{Msg: "data after the JSON document", Offset: off}
	}
	return nil
}

// isSpace is JSON's white space.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// decodeError is why the token stream failed (tokenErr, at off), as json.Decoder.Decode reports
// it: at the offending byte, or at the end of data when it ends early.
func decodeError(data []byte, off int64, tokenErr error) *SyntaxError {
	var se *json.SyntaxError
	switch err := json.NewDecoder(bytes.NewReader(data)).Decode(new(json.RawMessage)); {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return &SyntaxError{Msg: "unexpected end of JSON input", Offset: int64(len(data))}
	case errors.As(err, &se):
		return &SyntaxError{Msg: se.Error(), Offset: se.Offset - 1} // Offset counts the bytes read, the bad one too
	}
	return &SyntaxError{Msg: tokenErr.Error(), Offset: off} // not expected: Decode accepts what Token refused
}

// builder builds nodes from the token stream of valid JSON.
type builder struct {
	dec      *json.Decoder
	pos      positions
	maxDepth int
}

func (b *builder) value(depth int) (*Node, error) {
	if b.maxDepth > 0 && depth > b.maxDepth {
		return nil, &SyntaxError{Msg: fmt.Sprintf("nested deeper than %d levels", b.maxDepth), Offset: b.dec.InputOffset()}
	}
	tok, err := b.dec.Token()
	if err != nil {
		return nil, err
	}
	n := &Node{}
	n.Line, n.Column = b.pos.at(int(b.dec.InputOffset()) - 1)
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			n.Kind = Array
			return n, b.elems(n, depth)
		}
		n.Kind = Object
		return n, b.members(n, depth)
	case string:
		n.Kind, n.Str = String, t
	case json.Number:
		n.Kind, n.Num = Number, t
	case bool:
		n.Kind, n.Bool = Bool, t
	case nil:
		n.Kind = Null
	}
	return n, nil
}

// elems reads an array's values and its closing bracket.
func (b *builder) elems(n *Node, depth int) error {
	for b.dec.More() {
		v, err := b.value(depth + 1)
		if err != nil {
			return err
		}
		n.Elems = append(n.Elems, v)
	}
	_, err := b.dec.Token()
	return err
}

// members reads an object's members and its closing brace.
func (b *builder) members(n *Node, depth int) error {
	for b.dec.More() {
		k, err := b.value(depth + 1)
		if err != nil {
			return err
		}
		v, err := b.value(depth + 1)
		if err != nil {
			return err
		}
		n.Members = append(n.Members, Member{Key: k, Value: v})
	}
	_, err := b.dec.Token()
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

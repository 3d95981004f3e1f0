package jsonnode

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestParseKeepsOrderDuplicatesAndPositions(t *testing.T) {
	n, err := Parse([]byte("{\"b\": 1,\n \"a\": [true, null],\n \"b\": \"x\"}"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range n.Members {
		keys = append(keys, m.Key.Str)
	}
	if got := strings.Join(keys, " "); got != "b a b" {
		t.Errorf("members %q, want every key in order", got)
	}
	a := n.Members[1]
	if a.Key.Line != 2 || a.Value.Kind != Array || a.Value.Line != 2 || a.Value.Column != 7 || len(a.Value.Elems) != 2 {
		t.Errorf("a = %+v at %d:%d", a.Value, a.Value.Line, a.Value.Column)
	}
	u := n.Unique()
	if len(u) != 2 || u[0].Key.Str != "b" || u[0].Value.Str != "x" || u[1].Key.Str != "a" {
		t.Errorf("Unique() = %+v, want b (its last value) then a", u)
	}
	if v, ok := n.Get("b"); !ok || v.Str != "x" {
		t.Errorf("Get(b) = %+v, %v", v, ok)
	}
}

// TestParseErrorsPointAtTheByte: every error names the offending byte, including those inside a
// scalar (where json.Decoder.Token's offset is wrong) and the end of a truncated document.
func TestParseErrorsPointAtTheByte(t *testing.T) {
	for _, tc := range []struct {
		doc, msg  string
		line, col int
	}{
		{`{"g": {"enabled": tru}}`, "in literal true", 1, 22},
		{`{"a": "b\q"}`, "in string escape code", 1, 10},
		{"[1,\n ,2]", "looking for beginning of value", 2, 2},
		{"{\"a\":1,}", "looking for beginning of object key string", 1, 8},
		{"{\"g\": {\n", "unexpected end of JSON input", 2, 1},
		{"", "unexpected end of JSON input", 1, 1},
		{"{}\n\n  [", "data after the JSON document", 3, 3},
	} {
		_, err := Parse([]byte(tc.doc), Options{})
		var se *SyntaxError
		if !errors.As(err, &se) || !strings.Contains(se.Msg, tc.msg) || se.Line != tc.line || se.Column != tc.col {
			t.Errorf("%q: %v, want %q at line %d, column %d", tc.doc, err, tc.msg, tc.line, tc.col)
		}
	}
}

// Positions are 1-based lines and byte columns.
func TestPositions(t *testing.T) {
	p := newPositions([]byte("ab\ncd\n\nx"))
	for off, want := range map[int][2]int{0: {1, 1}, 2: {1, 3}, 3: {2, 1}, 6: {3, 1}, 7: {4, 1}} {
		if l, c := p.at(off); l != want[0] || c != want[1] {
			t.Errorf("at(%d) = %d:%d, want %d:%d", off, l, c, want[0], want[1])
		}
	}
}

func TestParseMaxDepth(t *testing.T) {
	doc := []byte(strings.Repeat("[", 5) + strings.Repeat("]", 5)) // the innermost list is 4 levels below the root
	if _, err := Parse(doc, Options{MaxDepth: 3}); err == nil || !strings.Contains(err.Error(), "nested deeper than 3 levels") {
		t.Errorf("MaxDepth 3: %v", err)
	}
	if _, err := Parse(doc, Options{MaxDepth: 4}); err != nil {
		t.Errorf("MaxDepth 4: %v", err)
	}
	if _, err := Parse(doc, Options{}); err != nil {
		t.Errorf("no bound: %v", err)
	}
}

// FuzzParse: Parse accepts exactly what encoding/json accepts, and its Unique view is the value
// encoding/json decodes.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"a": [1, 2.5e3, "x\u00e9"], "a": {"b": null, "c": false}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := Parse(data, Options{})
		if valid := json.Valid(data); valid != (err == nil) {
			t.Fatalf("json.Valid %v, Parse error %v", valid, err)
		}
		var se *SyntaxError
		if err != nil && (!errors.As(err, &se) || se.Offset < 0 || se.Offset > int64(len(data))) {
			t.Fatalf("error %T %v", err, err)
		}
		if err != nil {
			atTheByte(t, data, se)
			return
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var want any
		if err := dec.Decode(&want); err != nil {
			t.Fatal(err)
		}
		if got := plain(n); !reflect.DeepEqual(got, want) {
			t.Fatalf("Parse gives %#v, encoding/json %#v", got, want)
		}
	})
}

// atTheByte checks that an "invalid character 'c' ..." error is at a c, and that an early end is
// at the end.
func atTheByte(t *testing.T, data []byte, se *SyntaxError) {
	switch c, ok := strings.CutPrefix(se.Msg, "invalid character "); {
	case ok && (se.Offset >= int64(len(data)) || !strings.HasPrefix(c, quoteChar(data[se.Offset]))):
		t.Fatalf("%q: %v at offset %d", data, se, se.Offset)
	case se.Msg == "unexpected end of JSON input" && se.Offset != int64(len(data)):
		t.Fatalf("%q: %v at offset %d of %d", data, se, se.Offset, len(data))
	}
}

// quoteChar renders a byte as encoding/json's messages do.
func quoteChar(c byte) string {
	switch c {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	s := strconv.Quote(string(rune(c)))
	return "'" + s[1:len(s)-1] + "'"
}

// plain is n as encoding/json decodes into an any, with UseNumber.
func plain(n *Node) any {
	switch n.Kind {
	case Bool:
		return n.Bool
	case Number:
		return n.Num
	case String:
		return n.Str
	case Array:
		out := []any{}
		for _, e := range n.Elems {
			out = append(out, plain(e))
		}
		return out
	case Object:
		out := map[string]any{}
		for _, m := range n.Unique() {
			out[m.Key.Str] = plain(m.Value)
		}
		return out
	}
	return nil
}

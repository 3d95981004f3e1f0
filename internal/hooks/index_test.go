package hooks

import (
	"slices"
	"testing"
	"time"
)

func TestIndexLookup(t *testing.T) {
	ix := NewIndex(mustParse(t, docsExample+"")) // security-gate (pre), audit-logging (post)
	gate := Match{Group: "security-gate", Event: EventPre, Timeout: 10 * time.Second,
		URL: "https://policy.example.com/hooks/pre", Audience: "https://policy.example.com"}
	audit := Match{Group: "audit-logging", Event: EventPost, Timeout: DefaultTimeout,
		URL: "https://audit.example.com/events", Audience: "https://audit.example.com"}
	for _, tc := range []struct {
		scheme, host string
		port         uint16
		path         string
		want         Match
		ok           bool
	}{
		{"https", "policy.example.com", 443, "/hooks/pre", gate, true},
		{"HTTPS", "POLICY.Example.COM.", 443, "/hooks/pre", gate, true}, // scheme and host case, trailing dot
		{"https", "audit.example.com", 443, "/events", audit, true},
		{"https", "policy.example.com", 8443, "/hooks/pre", Match{}, false}, // other port
		{"http", "policy.example.com", 80, "/hooks/pre", Match{}, false},    // other scheme
		{"https", "policy.example.com", 443, "/hooks/pre/", Match{}, false}, // other path
		{"https", "policy.example.com", 443, "/hooks/PRE", Match{}, false},  // paths are case-sensitive
		{"https", "evil.example.com", 443, "/hooks/pre", Match{}, false},
		{"https", "old.example.com", 443, "/pre", Match{}, false}, // disabled group
		{"https", "bad host", 443, "/pre", Match{}, false},
	} {
		got, ok := ix.Lookup(tc.scheme, tc.host, tc.port, tc.path)
		if ok != tc.ok || got != tc.want {
			t.Errorf("Lookup(%s, %s, %d, %s) = %+v %t, want %+v %t", tc.scheme, tc.host, tc.port, tc.path, got, ok, tc.want, tc.ok)
		}
	}
	if ix.Len() != 2 {
		t.Errorf("Len %d, want 2 (command hooks and disabled groups are not indexed)", ix.Len())
	}
}

func TestIndexPortsPathsAndQuery(t *testing.T) {
	ix := NewIndex(mustParse(t, `{"g": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [
		{"type": "http", "url": "https://a.example.com:443/x?token=ignored"},
		{"type": "http", "url": "http://b.example.com"},
		{"type": "http", "url": "http://c.example.com:8080/p%2Fq"},
		{"type": "http", "url": "http://[2001:DB8::1]:8080/v6"},
		{"type": "http", "url": "https://Bücher.example/"}
	]}]}}`))
	for _, tc := range []struct {
		scheme, host string
		port         uint16
		path, aud    string
	}{
		{"https", "a.example.com", 443, "/x", "https://a.example.com"}, // explicit default port, query ignored
		{"http", "b.example.com", 80, "/", "http://b.example.com"},     // no path is "/"
		{"http", "b.example.com", 80, "", "http://b.example.com"},      // "" is "/"
		{"http", "c.example.com", 8080, "/p%2Fq", "http://c.example.com:8080"},
		{"http", "[2001:db8::1]", 8080, "/v6", "http://[2001:db8::1]:8080"},
		{"http", "2001:db8::1", 8080, "/v6", "http://[2001:db8::1]:8080"},
		{"https", "xn--bcher-kva.example", 443, "/", "https://xn--bcher-kva.example"},
	} {
		m, ok := ix.Lookup(tc.scheme, tc.host, tc.port, tc.path)
		if !ok || m.Audience != tc.aud {
			t.Errorf("Lookup(%s, %s, %d, %q) = %+v %t, want audience %s", tc.scheme, tc.host, tc.port, tc.path, m, ok, tc.aud)
		}
	}
	if _, ok := ix.Lookup("http", "c.example.com", 8080, "/p/q"); ok {
		t.Error("an escaped slash matched a real one: paths compare as sent")
	}
	if !ix.Intercepts("A.example.com", 443) || ix.Intercepts("a.example.com", 8443) || !ix.Intercepts("2001:db8::1", 8080) {
		t.Error("Intercepts")
	}
}

func TestIndexSharedURLPreWins(t *testing.T) {
	ix := NewIndex(mustParse(t, `{
		"audit": {"post_tool_execution": [{"matcher": "code_execution", "hooks": [{"type": "http", "url": "https://p.example.com/h", "timeout": 5}]}]},
		"gate-a": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [{"type": "http", "url": "https://p.example.com/h", "timeout": 20}]}]},
		"gate-b": {"pre_tool_execution": [{"matcher": "view_file", "hooks": [{"type": "http", "url": "https://P.example.com:443/h", "timeout": 8}]}]}
	}`))
	m, ok := ix.Lookup("https", "p.example.com", 443, "/h")
	want := Match{Group: "gate-a", Event: EventPre, Timeout: 8 * time.Second, URL: "https://p.example.com/h", Audience: "https://p.example.com"}
	if !ok || m != want {
		t.Errorf("got %+v, want %+v (pre wins, first group names it, shortest timeout)", m, want)
	}
	if ms := ix.Matches(); len(ms) != 1 || ms[0] != want {
		t.Errorf("Matches %+v", ms)
	}
}

func TestIndexEmpty(t *testing.T) {
	var nilIndex *Index
	for _, ix := range []*Index{NewIndex(nil), nilIndex} {
		if _, ok := ix.Lookup("https", "x", 443, "/"); ok || ix.Len() != 0 || ix.Intercepts("x", 443) || len(ix.Matches()) != 0 {
			t.Error("empty index matched")
		}
	}
}

func TestIndexHosts(t *testing.T) {
	ix := NewIndex(mustParse(t, `{"g": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [
		{"type": "http", "url": "https://B.example/x"},
		{"type": "http", "url": "https://a.example/x"},
		{"type": "http", "url": "http://a.example:8080/y"}
	]}]}, "off": {"enabled": false, "pre_tool_execution": [{"matcher": "code_execution", "hooks": [
		{"type": "http", "url": "https://disabled.example/x"}]}]}}`))
	if got := ix.Hosts(); !slices.Equal(got, []string{"a.example", "b.example"}) {
		t.Errorf("Hosts() = %v", got)
	}
	if (*Index)(nil).Hosts() != nil {
		t.Error("a nil index has hosts")
	}
}

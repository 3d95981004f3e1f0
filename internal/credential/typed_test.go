package credential

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

func TestStatusActiveOnEgressdShapes(t *testing.T) {
	s, err := Parse("a", map[string]any{"token": planted, "status": "active"})
	if err != nil || len(s.Headers) != 1 || s.Headers[0].Value != "Bearer "+planted {
		t.Errorf("%v %v", s.Headers, err)
	}
}

func TestParseTypedShapes(t *testing.T) {
	tests := []struct {
		name string
		raw  map[string]any
		want Header
	}{
		{"bearer_token defaults", map[string]any{"type": "bearer_token", "token": planted},
			Header{Name: "Authorization", Value: "Bearer " + planted}},
		{"bearer_token header_name and no prefix", map[string]any{"type": "bearer_token", "token": planted, "header_name": "x-goog-api-key", "prefix": ""},
			Header{Name: "X-Goog-Api-Key", Value: planted}},
		{"bearer_token other prefix", map[string]any{"type": "bearer_token", "token": planted, "prefix": "token", "status": "active"},
			Header{Name: "Authorization", Value: "token " + planted}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("cred-1", tt.raw)
			if err != nil {
				t.Fatal(err)
			}
			if s.Type != TypeBearerToken || len(s.Headers) != 1 || s.Headers[0] != tt.want {
				t.Errorf("got %v, want %v (values compared, not shown)", s.Headers, tt.want)
			}
		})
	}
}

func TestParseOAuth2AndEnvVar(t *testing.T) {
	o, err := Parse("oa", map[string]any{"type": "oauth2", "client_id": "cid", "client_secret": planted,
		"refresh_token": planted + "-r", "token_url": "https://auth.test/token", "scopes": []any{"a", "b"}})
	if err != nil || o.OAuth2 == nil || o.OAuth2.RefreshToken != planted+"-r" || len(o.OAuth2.Scopes) != 2 || len(o.Headers) != 0 {
		t.Fatalf("oauth2: %v %v", o.OAuth2, err)
	}
	e, err := Parse("ev", map[string]any{"type": "environment_variable", "value": planted,
		"injection_location": []any{"query", "header", "query"}, "trusted_domains": []any{"API.Example.com.", "*.example.org"}})
	if err != nil || e.Env == nil || e.Env.Value != planted {
		t.Fatalf("environment_variable: %v %v", e.Env, err)
	}
	if got := fmt.Sprint(e.Env.Locations, e.Env.TrustedDomains); got != "[header query] [api.example.com *.example.org]" {
		t.Errorf("normalised: %s", got)
	}
	for host, want := range map[string]bool{"api.example.com": true, "a.b.example.org": true, "example.org": false, "badexample.org": false, "other.com": false} {
		if e.Env.Trusts(host) != want {
			t.Errorf("Trusts(%s) = %v", host, !want)
		}
	}
	single, err := Parse("ev", map[string]any{"type": "environment_variable", "value": planted, "injection_location": "body"})
	if err != nil || !single.Env.In(LocationBody) || single.Env.In(LocationHeader) {
		t.Errorf("single location: %v %v", single.Env, err)
	}
}

func TestParseTypedRejects(t *testing.T) {
	tests := []struct {
		name string
		raw  map[string]any
		want string // the field and the fix
	}{
		{"unknown type", map[string]any{"type": "api_key", "token": planted}, `"api_key" is not a credential type; use "bearer_token"`},
		{"bearer no token", map[string]any{"type": "bearer_token"}, `bearer_token: "token" is required`},
		{"bearer unknown key", map[string]any{"type": "bearer_token", "token": planted, "header": "X"}, `unknown key "header"; the fields are token, header_name, prefix`},
		{"bearer bad header", map[string]any{"type": "bearer_token", "token": planted, "header_name": "X Key"}, `header_name "X Key" is not a valid header name`},
		{"bearer hop-by-hop", map[string]any{"type": "bearer_token", "token": planted, "header_name": "connection"}, `"Connection" cannot be injected`},
		{"bearer prefix with space", map[string]any{"type": "bearer_token", "token": planted, "prefix": "Bearer "}, `prefix must be one word`},
		{"bearer token has prefix", map[string]any{"type": "bearer_token", "token": "Bearer " + planted}, `token starts with the prefix`},
		{"bearer CRLF", map[string]any{"type": "bearer_token", "token": planted + "\r\nX: y"}, `token contains a control character`},
		{"oauth2 no url", map[string]any{"type": "oauth2", "client_id": "c", "client_secret": planted}, `"token_url" is required`},
		{"oauth2 http url", map[string]any{"type": "oauth2", "client_id": "c", "client_secret": planted, "token_url": "http://a.test/t"}, `"token_url" must be an https:// URL`},
		{"oauth2 no grant", map[string]any{"type": "oauth2", "client_id": "c", "token_url": "https://a.test/t"}, `give "refresh_token"`},
		{"oauth2 scopes", map[string]any{"type": "oauth2", "client_id": "c", "client_secret": planted, "token_url": "https://a.test/t", "scopes": []any{1}}, `"scopes" must be a list of non-empty strings`},
		{"env no location", map[string]any{"type": "environment_variable", "value": planted}, `"injection_location" is required: "header", "query", "body"`},
		{"env bad location", map[string]any{"type": "environment_variable", "value": planted, "injection_location": "cookie"}, `"cookie" is not "header", "query" or "body"`},
		{"env bad domain", map[string]any{"type": "environment_variable", "value": planted, "injection_location": "header", "trusted_domains": []any{"https://api.test/x"}}, `trusted_domains[0]: "https://api.test/x" contains a scheme; use just the host name, e.g. "api.test"`},
		{"bad status", map[string]any{"type": "bearer_token", "token": planted, "status": "disabled"}, `"status" must be "active" or "revoked"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("cred-1", tt.raw)
			if err == nil || !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "cred-1") {
				t.Errorf("error %q lacks %q", err, tt.want)
			}
			if strings.Contains(err.Error(), planted) {
				t.Errorf("error shows the secret: %q", err)
			}
		})
	}
}

func TestParseRevoked(t *testing.T) {
	for _, typ := range []string{"bearer_token", "oauth2", "environment_variable", ""} {
		raw := map[string]any{"type": typ, "status": "revoked", "token": planted}
		if typ == "" {
			delete(raw, "type")
		}
		_, err := Parse("r", raw)
		if !errors.Is(err, ErrRevoked) || errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), planted) {
			t.Errorf("%s: %v", typ, err)
		}
	}
}

// revokedBackend serves a revoked secret for "rev" and a bearer_token for everything else.
type revokedBackend struct{}

func (revokedBackend) Name() string { return "fake" }
func (revokedBackend) Read(_ context.Context, id string) (Secret, string, error) {
	if id == "rev" {
		s, err := Parse(id, map[string]any{"type": "bearer_token", "token": planted, "status": "revoked"})
		return s, "", err
	}
	s, err := Parse(id, map[string]any{"type": "bearer_token", "token": planted})
	return s, "1", err
}

func TestStoreRevokedIsUnavailableAtOnce(t *testing.T) {
	var mu sync.Mutex
	var results []string
	s := startStore(t, revokedBackend{}, []string{"ok", "rev"}, Options{Metrics: &Metrics{Refresh: func(id, r string) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, id+"="+r)
	}}})
	_, err := s.Get("rev")
	var ue *UnavailableError
	if !errors.As(err, &ue) || ue.Cause != CauseRevoked {
		t.Fatalf("Get(rev) = %v, want cause revoked", err)
	}
	if v, err := s.Get("ok"); err != nil || v.Type != TypeBearerToken {
		t.Errorf("Get(ok) = %v %v", v, err)
	}
	if st := s.Status()["rev"]; st.Ready || !strings.HasPrefix(st.Error, "revoked") {
		t.Errorf("status = %+v", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(results, " "), "rev=revoked") {
		t.Errorf("refresh results %v lack rev=revoked", results)
	}
}

func TestTypedSecretsRedact(t *testing.T) {
	o, _ := Parse("oa", map[string]any{"type": "oauth2", "client_id": "cid", "client_secret": planted,
		"refresh_token": planted, "token_url": "https://auth.test/token"})
	e, _ := Parse("ev", map[string]any{"type": "environment_variable", "value": planted, "injection_location": "header"})
	for _, v := range []any{o.OAuth2, e.Env, Value{ID: "oa", OAuth2: o.OAuth2}, Value{ID: "ev", Env: e.Env}} {
		var out []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
			out = append(out, fmt.Sprintf(verb, v))
		}
		j, _ := json.Marshal(v)
		out = append(out, string(j))
		var buf strings.Builder
		zl := zerolog.New(&buf)
		zl.Info().Interface("v", v).Msg("")
		if m, ok := v.(zerolog.LogObjectMarshaler); ok {
			zl.Info().Object("o", m).Msg("")
		}
		out = append(out, buf.String())
		if all := strings.Join(out, "\n"); strings.Contains(all, planted) || strings.Contains(all, fmt.Sprintf("%x", planted)) {
			t.Errorf("%T leaks:\n%s", v, all)
		}
	}
}

// FuzzParse: any JSON object parses or fails with ErrInvalid/ErrRevoked, never panics,
// and no error shows a value planted in a secret field.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"type":"bearer_token","token":"T","header_name":"X-Api-Key","prefix":""}`,
		`{"type":"oauth2","client_id":"c","client_secret":"T","refresh_token":"T","token_url":"https://a.test/t","scopes":["x"]}`,
		`{"type":"environment_variable","value":"T","injection_location":["header","query"],"trusted_domains":["*.a.test"]}`,
		`{"type":"bearer_token","token":"T","status":"revoked"}`,
		`{"token":"T"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		var raw map[string]any
		if json.Unmarshal([]byte(doc), &raw) != nil || raw == nil {
			return
		}
		for _, k := range []string{"token", "client_secret", "refresh_token", "value"} {
			if _, ok := raw[k]; ok {
				raw[k] = planted
			}
		}
		s, err := Parse("id", raw)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrRevoked) {
				t.Fatalf("error wraps neither ErrInvalid nor ErrRevoked: %v", err)
			}
			if strings.Contains(err.Error(), planted) {
				t.Fatalf("error shows the secret: %v", err)
			}
			return
		}
		if s.empty() {
			t.Fatal("no error and an empty secret")
		}
	})
}

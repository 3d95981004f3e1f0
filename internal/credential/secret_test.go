package credential

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// planted is a secret value placed in every input: no error or rendering may contain it.
const planted = "PLANTED-s3cr3t-v4lue"

func TestParseSecretShapes(t *testing.T) {
	tests := []struct {
		name string
		raw  map[string]any
		want []Header
	}{
		{"token gives Bearer", map[string]any{"token": planted},
			[]Header{{Name: "Authorization", Value: "Bearer " + planted}}},
		{"headers canonicalised and sorted", map[string]any{"headers": map[string]any{"x-org-id": "o1", "X-API-KEY": planted}},
			[]Header{{Name: "X-Api-Key", Value: planted}, {Name: "X-Org-Id", Value: "o1"}}},
		{"basic (RFC 7617 example)", map[string]any{"username": "Aladdin", "password": "open sesame"},
			[]Header{{Name: "Authorization", Value: "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="}}},
		{"basic with empty password (key as username)", map[string]any{"username": "sk_test", "password": ""},
			[]Header{{Name: "Authorization", Value: "Basic c2tfdGVzdDo="}}},
		{"header value with inner space and tab", map[string]any{"headers": map[string]any{"Authorization": "Token a\tb c"}},
			[]Header{{Name: "Authorization", Value: "Token a\tb c"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSecret("cred-1", tt.raw)
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", names(got), names(tt.want)) // names only: this is a secret
				for i := range got {
					if i < len(tt.want) && got[i].Value != tt.want[i].Value {
						t.Errorf("header %s: value differs", got[i].Name)
					}
				}
			}
		})
	}
}

func names(hs []Header) []string { return Value{Headers: hs}.Names() }

func TestParseSecretRejects(t *testing.T) {
	long := strings.Repeat("x", 50) + planted
	tests := []struct {
		name string
		raw  map[string]any
		want string // in the message besides the ID
		hint bool   // the expected-shapes hint is appended
	}{
		{"not an object", nil, "not a JSON object", true},
		{"empty", map[string]any{}, "secret is empty", true},
		{"unknown key", map[string]any{"tokn": planted}, `unknown key "tokn"`, true},
		{"secret as a long key", map[string]any{long: "x"}, "not shown", true},
		{"token and headers", map[string]any{"token": planted, "headers": map[string]any{"X-A": planted}}, `both "token" and "headers"`, true},
		{"token and username", map[string]any{"token": planted, "username": "u", "password": planted}, "mixed", true},
		{"token not a string", map[string]any{"token": []any{planted}}, `"token" is not a string`, true},
		{"empty token", map[string]any{"token": ""}, "empty token", true},
		{"token with scheme", map[string]any{"token": "Bearer " + planted}, `starts with "Bearer "`, false},
		{"token with trailing newline", map[string]any{"token": planted + "\n"}, "control character", false},
		{"token with leading space", map[string]any{"token": " " + planted}, "whitespace", false},
		{"headers not an object", map[string]any{"headers": planted}, `"headers" is not an object`, true},
		{"headers empty", map[string]any{"headers": map[string]any{}}, `"headers" is empty`, true},
		{"header value CRLF", map[string]any{"headers": map[string]any{"x-api-key": planted + "\r\nX-Evil: 1"}}, `header "X-Api-Key": value contains a control character`, false},
		{"header value LF", map[string]any{"headers": map[string]any{"X-Api-Key": planted + "\n"}}, `header "X-Api-Key"`, false},
		{"header value NUL", map[string]any{"headers": map[string]any{"X-Api-Key": planted + "\x00"}}, "control character", false},
		{"header value DEL", map[string]any{"headers": map[string]any{"X-Api-Key": planted + "\x7f"}}, "control character", false},
		{"header value empty", map[string]any{"headers": map[string]any{"X-Api-Key": ""}}, "is empty", false},
		{"header value not a string", map[string]any{"headers": map[string]any{"X-Api-Key": map[string]any{"v": planted}}}, "not a string", false},
		{"header name with space", map[string]any{"headers": map[string]any{"X Api": planted}}, `header "X Api": invalid header name`, false},
		{"header name with CRLF", map[string]any{"headers": map[string]any{"X-Api\r\nX-Evil": planted}}, `header "X-Api\r\nX-Evil": invalid`, false},
		{"header Host", map[string]any{"headers": map[string]any{"host": planted}}, `header "Host": cannot be injected`, false},
		{"header Content-Length", map[string]any{"headers": map[string]any{"Content-Length": "1"}}, "cannot be injected", false},
		{"header Egressd-*", map[string]any{"headers": map[string]any{"egressd-reason": planted}}, `"Egressd-Reason": cannot be injected`, false},
		{"header twice", map[string]any{"headers": map[string]any{"x-api-key": planted, "X-API-KEY": planted}}, `"X-Api-Key" given twice`, false},
		{"username only", map[string]any{"username": planted}, "go together", true},
		{"password only", map[string]any{"password": planted}, "go together", true},
		{"username not a string", map[string]any{"username": 7, "password": planted}, "must be strings", true},
		{"empty username", map[string]any{"username": "", "password": planted}, "empty username", true},
		{"username with colon", map[string]any{"username": "a:" + planted, "password": planted}, `contains ":"`, false},
		{"password with newline", map[string]any{"username": "u", "password": planted + "\n"}, "control character", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSecret("cred-1", tt.raw)
			if err == nil {
				t.Fatalf("accepted: %d headers", len(got))
			}
			msg := err.Error()
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(err, ErrInvalid) = false: %s", msg)
			}
			if strings.Contains(msg, planted) {
				t.Fatalf("error contains the secret value: %s", msg)
			}
			if !strings.HasPrefix(msg, "credential cred-1: ") || !strings.Contains(msg, tt.want) {
				t.Errorf("error %q, want the ID and %q", msg, tt.want)
			}
			if hinted := strings.HasSuffix(msg, expectedShapes); hinted != tt.hint {
				t.Errorf("expected-shapes hint %v, want %v: %s", hinted, tt.hint, msg)
			}
		})
	}
}

package credential

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseAWS(t *testing.T) {
	s, err := Parse("a", map[string]any{"type": "aws", "access_key_id": "AKIAREAL", "secret_access_key": "sec/ret+", "session_token": "tok"})
	if err != nil || s.AWS == nil || s.AWS.SessionToken != "tok" || len(s.Headers) != 0 {
		t.Fatalf("static: %+v %v", s, err)
	}
	s, err = Parse("a", map[string]any{"type": "aws", "vault_aws": map[string]any{"role": "deploy"}})
	if err != nil || s.AWS.Vault.Path() != "aws/sts/deploy" || s.AWS.Usable(s.AWS.Expires) {
		t.Fatalf("vault_aws defaults: %+v %v", s.AWS, err)
	}
	for name, raw := range map[string]map[string]any{
		"both":        {"type": "aws", "access_key_id": "A", "secret_access_key": "s", "vault_aws": map[string]any{"role": "r"}},
		"no secret":   {"type": "aws", "access_key_id": "A"},
		"bad kind":    {"type": "aws", "vault_aws": map[string]any{"role": "r", "kind": "iam"}},
		"role path":   {"type": "aws", "vault_aws": map[string]any{"role": "a/b"}},
		"unknown key": {"type": "aws", "access_key_id": "A", "secret_access_key": "s", "region": "x"},
		"space":       {"type": "aws", "access_key_id": "A", "secret_access_key": "sec ret"},
	} {
		if _, err := Parse("a", raw); !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "sec ret") {
			t.Errorf("%s: %v, want ErrInvalid without the value", name, err)
		}
	}
}

func TestAWSRedacts(t *testing.T) {
	a := &AWS{AccessKeyID: "AKIAREALKEY", SecretAccessKey: "the-secret", SessionToken: "the-token"}
	j, _ := json.Marshal(a)
	for _, s := range []string{fmt.Sprintf("%v %+v %#v %s %q %x", a, a, a, a, a, a), string(j)} {
		for _, v := range a.Secrets() {
			if strings.Contains(s, v) {
				t.Fatalf("rendering shows a key: %s", s)
			}
		}
	}
}

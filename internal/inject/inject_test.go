package inject

import (
	"errors"
	"net/http"
	"reflect"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
)

type fakeCreds map[string]credential.Value

func (f fakeCreds) Get(id string) (credential.Value, error) {
	v, ok := f[id]
	if !ok {
		return credential.Value{}, &credential.UnavailableError{ID: id, Cause: credential.CauseNotFound}
	}
	return v, nil
}

func rule(t testing.TB, e allowlist.Entry) (*Injector, *allowlist.Rule) {
	t.Helper()
	p, err := allowlist.Compile([]allowlist.Entry{e, {Domain: "*"}}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	creds := fakeCreds{"api": {ID: "api", Version: "7", Headers: []credential.Header{
		{Name: "Authorization", Value: "Bearer from-credential"}}}}
	return New(p, creds), p.Rules()[0]
}

func TestApplyReplacesEveryClientCopy(t *testing.T) {
	in, r := rule(t, allowlist.Entry{Domain: "api.example.com", Credential: "api",
		Transform: []allowlist.Header{{Name: "Authorization", Value: "Bearer from-transform"}, {Name: "X-Key", Value: "k"}}})
	h := http.Header{
		"Authorization": {"Bearer client-1", "Bearer client-2"},
		"authorization": {"lowercase"},
		"X-KEY":         {"client"},
		"X-Other":       {"kept"},
	}
	trailer := http.Header{"Authorization": {"trailer"}, "X-Key": nil, "X-Checksum": {"c"}}
	res, err := in.Apply(r, h, trailer)
	if err != nil {
		t.Fatal(err)
	}
	want := http.Header{"Authorization": {"Bearer from-credential"}, "X-Key": {"k"}, "X-Other": {"kept"}}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("headers = %v, want %v (the credential wins over the transform)", h, want)
	}
	if !reflect.DeepEqual(trailer, http.Header{"X-Checksum": {"c"}}) {
		t.Errorf("trailer = %v", trailer)
	}
	if res.Credential != "api" || res.Version != "7" || !reflect.DeepEqual(res.Names, []string{"Authorization", "X-Key"}) {
		t.Errorf("result = %+v", res)
	}
}

func TestApplyCredentialUnavailableLeavesRequestUntouched(t *testing.T) {
	in, r := rule(t, allowlist.Entry{Domain: "api.example.com", Credential: "gone"})
	h := http.Header{"Authorization": {"Bearer client"}}
	_, err := in.Apply(r, h, nil)
	if !errors.Is(err, credential.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if h.Get("Authorization") != "Bearer client" {
		t.Error("headers changed although the request will be refused")
	}
}

func TestApplyNonInjectingRuleDoesNothing(t *testing.T) {
	p, err := allowlist.Compile([]allowlist.Entry{{Domain: "api.example.com", Credential: "api"}, {Domain: "*"}}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	in := New(p, fakeCreds{})
	starRule := p.Rules()[1]
	h := http.Header{"Authorization": {"Bearer client"}}
	res, err := in.Apply(starRule, h, nil)
	if err != nil || len(res.Names) != 0 || res.Scrub != nil || h.Get("Authorization") != "Bearer client" {
		t.Errorf("a rule that injects nothing changed the request: %v %+v %v", err, res, h)
	}
}

func TestApplyRuleOfAnotherPolicyFailsClosed(t *testing.T) {
	in, _ := rule(t, allowlist.Entry{Domain: "api.example.com", Credential: "api"})
	_, other := rule(t, allowlist.Entry{Domain: "api.example.com", Credential: "api"})
	h := http.Header{}
	if _, err := in.Apply(other, h, nil); !errors.Is(err, ErrNoProcessor) {
		t.Fatalf("err = %v, want ErrNoProcessor", err)
	}
	if len(h) != 0 {
		t.Errorf("headers changed: %v", h)
	}
}

// TestApplyScrubSet: the Set Apply returns masks every value it set (the
// transform's and the credential's), is compiled once while the values stay, and
// again when the credential's value changes, version or not.
func TestApplyScrubSet(t *testing.T) {
	p, err := allowlist.Compile([]allowlist.Entry{{Domain: "api.example.com", Credential: "api",
		Transform: []allowlist.Header{{Name: "X-Key", Value: "transform-secret-1"}}}}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	creds := fakeCreds{"api": {ID: "api", Version: "7", Headers: []credential.Header{{Name: "Authorization", Value: "Bearer credential-secret-1"}}}}
	in, r := New(p, creds), p.Rules()[0]
	res, _ := in.Apply(r, http.Header{}, nil)
	if got, n := res.Scrub.String("a=credential-secret-1 b=transform-secret-1"); n != 2 || got != "a=******************* b=******************" {
		t.Errorf("masked %d: %q", n, got)
	}
	again, _ := in.Apply(r, http.Header{}, nil)
	if again.Scrub != res.Scrub {
		t.Error("the Set was compiled again for the same values")
	}
	creds["api"] = credential.Value{ID: "api", Version: "7", Headers: []credential.Header{{Name: "Authorization", Value: "Bearer credential-secret-2"}}}
	rotated, _ := in.Apply(r, http.Header{}, nil)
	if _, n := rotated.Scrub.String("credential-secret-2"); n != 1 {
		t.Error("the rotated value is not masked")
	}
}

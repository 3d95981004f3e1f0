package inject

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
)

// Values the fuzzed rule injects; the client's copies never equal them.
const (
	transformValue = "transform-value"
	secretValue    = "secret-value"
)

// FuzzApply: a rule injects a transform header and a credential header whose
// names the fuzzer picks (any case), into client headers and a trailer the fuzzer
// writes (repeated names, case variants, non-canonical keys). After Apply every
// injected name is present exactly once, in any case, with the injected value (the
// credential's where both set it); the trailer holds no injected name in any case;
// every other client field is untouched; and Apply names exactly the injected
// headers.
func FuzzApply(f *testing.F) {
	f.Add("X-Api-Key", "x-api-key", "Authorization: client\nauthorization: two\nX-API-KEY: k\nX-Other: keep", "x-api-key: t\nX-Sum: 1")
	f.Add("X-Injected", "Authorization", "AUTHORIZATION: a\nAuthorization: b\nx-injected: c\nConnection: Authorization", "Authorization: smuggled\nX-Injected: smuggled")
	f.Add("authorization", "", "Authorization: client", "")
	f.Add("X-A", "X-A", "x-a: 1\nX-a: 2\nX-A: 3", "X-A: 4")
	f.Add("X-Key", "X-Token", "", "")
	f.Add("X-\u212aey", "X-Key", "X-Key: a\nX-\u212aey: b", "X-KEY: c") // Kelvin sign folds to k
	f.Fuzz(func(t *testing.T, transformName, credName, headers, trailer string) {
		in, rule, want := fuzzInjector(transformName, credName)
		if in == nil {
			return
		}
		h, tr := parseBlock(headers), parseBlock(trailer)
		clientH, clientTr := h.Clone(), tr.Clone()
		res, err := in.Apply(rule, h, tr)
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		names := make([]string, 0, len(want))
		for name, value := range want {
			names = append(names, name)
			if got := valuesFold(h, name); len(got) != 1 || got[0] != value {
				t.Fatalf("%s after Apply: %q, want exactly %q (client headers %q)", name, got, value, headers)
			}
			if got := valuesFold(tr, name); len(got) != 0 {
				t.Fatalf("trailer keeps %s: %q", name, got)
			}
		}
		if !sameNames(res.Names, names) {
			t.Fatalf("Apply named %q, want %q", res.Names, names)
		}
		checkUntouched(t, clientH, h, want)
		checkUntouched(t, clientTr, tr, want)
	})
}

// fuzzInjector builds an Injector for one rule with a transform header named
// transformName and, when credName is not empty, a credential whose "headers"
// secret sets credName (as the file and Vault backends parse it). It returns nil
// when the config loader or the secret parser would refuse the names. want maps
// each injected canonical name to the value it must end with.
func fuzzInjector(transformName, credName string) (*Injector, *allowlist.Rule, map[string]string) {
	entry := allowlist.Entry{Domain: "api.example.com", Transform: []allowlist.Header{{Name: transformName, Value: transformValue}}}
	var creds fuzzCreds
	if credName != "" {
		hs, err := credential.ParseSecret("cred", map[string]any{"headers": map[string]any{credName: secretValue}})
		if err != nil {
			return nil, nil, nil
		}
		entry.Credential, creds = "cred", fuzzCreds{credential.Value{ID: "cred", Version: "v1", Headers: hs}}
	}
	p, err := allowlist.Compile([]allowlist.Entry{entry}, allowlist.Options{})
	if err != nil {
		return nil, nil, nil
	}
	rule := p.Rules()[0]
	want := map[string]string{}
	for _, x := range rule.Transform {
		want[http.CanonicalHeaderKey(x.Name)] = x.Value
	}
	for _, x := range creds.v.Headers {
		want[http.CanonicalHeaderKey(x.Name)] = x.Value // the credential wins
	}
	return New(p, creds), rule, want
}

type fuzzCreds struct{ v credential.Value }

func (c fuzzCreds) Get(string) (credential.Value, error) { return c.v, nil }

// parseBlock reads "Name: value" lines into a header map keyed by the names as
// written (not canonicalised), as a hand-built or HTTP/2 header map may be.
func parseBlock(s string) http.Header {
	h := http.Header{}
	for i, line := range strings.Split(s, "\n") {
		if i == 64 {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		h[name] = append(h[name], strings.TrimSpace(value))
	}
	return h
}

// valuesFold returns the values of every key equal to name in ASCII case, which is
// how an upstream reads header names.
func valuesFold(h http.Header, name string) []string {
	var out []string
	for k, vs := range h {
		if asciiEqualFold(k, name) {
			out = append(out, vs...)
		}
	}
	return out
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// checkUntouched fails if a client field that names no injected header, in ASCII
// or Unicode case folding, was changed or dropped.
func checkUntouched(t *testing.T, before, after http.Header, injected map[string]string) {
	t.Helper()
	for k, vs := range before {
		if foldsToAny(k, injected) {
			continue
		}
		if !slices.Equal(after[k], vs) {
			t.Fatalf("client field %q changed from %q to %q", k, vs, after[k])
		}
	}
}

func foldsToAny(k string, names map[string]string) bool {
	for n := range names {
		if strings.EqualFold(k, n) {
			return true
		}
	}
	return false
}

func sameNames(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

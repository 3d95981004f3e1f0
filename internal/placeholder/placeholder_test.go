package placeholder

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/credential"
)

func TestKeyCreatedOnceAndStable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	k1, err := LoadKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	k2, err := LoadKey(dir)
	if err != nil || string(k1) != string(k2) {
		t.Fatalf("second load differs: %v", err)
	}
	p := Derive(k1, "env_a", "openai")
	if p != Derive(k2, "env_a", "openai") {
		t.Error("not stable")
	}
	if !regexp.MustCompile(`^egressd_ph_openai_[0-9a-f]{32}$`).MatchString(p) {
		t.Errorf("placeholder %q", p)
	}
	other, _ := LoadKey(t.TempDir())
	if p == Derive(other, "env_a", "openai") || p == Derive(k1, "env_b", "openai") || p == Derive(k1, "env_a", "openai2") {
		t.Error("placeholders of another key, environment or credential collide")
	}
	os.WriteFile(filepath.Join(dir, KeyFile), []byte("short\n"), 0o600)
	if _, err := LoadKey(dir); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("corrupt key: %v", err)
	}
}

type creds map[string]credential.Value

func (c creds) Get(id string) (credential.Value, error) {
	v, ok := c[id]
	if !ok {
		return v, &credential.UnavailableError{ID: id, Cause: credential.CauseNotFound}
	}
	return v, nil
}

// FuzzQuery: any query either keeps every placeholder-free component byte for byte, or
// has the placeholder replaced; it never keeps a placeholder in a trusted request.
func FuzzQuery(f *testing.F) {
	key := []byte("fuzz-key-fuzz-key-fuzz-key-fuzz!")
	ph := Derive(key, "e", "k")
	for _, s := range []string{"a=1&b=" + ph, "x=" + url.QueryEscape(ph) + "&y=%zz", ph, "a=%65gressd_ph_k_", "=&&=" + ph + "="} {
		f.Add(s)
	}
	r := New(key, "e", map[string]string{"K": "k"}, nil, creds{"k": {Env: &credential.EnvVar{Value: "V&=", Locations: []string{"query"}, TrustedDomains: []string{"t.test"}}}})
	f.Fuzz(func(t *testing.T, q string) {
		req := &http.Request{Header: http.Header{}, URL: &url.URL{RawQuery: q}, Body: http.NoBody}
		if _, err := r.Apply(req, "t.test", nil, false); err != nil {
			t.Fatal(err)
		}
		if dec, _ := url.QueryUnescape(req.URL.RawQuery); strings.Contains(req.URL.RawQuery, ph) || strings.Contains(dec, ph) && !strings.Contains(q, "%25") {
			t.Fatalf("placeholder kept: %q -> %q", q, req.URL.RawQuery)
		}
		if _, err := r.Apply(&http.Request{Header: http.Header{}, URL: &url.URL{RawQuery: q}, Body: http.NoBody}, "other.test", nil, false); err == nil && strings.Contains(q, ph) {
			t.Fatalf("placeholder to another host accepted: %q", q)
		}
	})
}

// pendingCreds has no value until read is closed; Await waits for it.
type pendingCreds struct {
	creds
	read chan struct{}
}

func (c pendingCreds) Get(id string) (credential.Value, error) {
	select {
	case <-c.read:
		return c.creds.Get(id)
	default:
		return credential.Value{}, &credential.UnavailableError{ID: id, Cause: credential.CauseNeverRead}
	}
}

func (c pendingCreds) Await(ctx context.Context, _ string) {
	select {
	case <-c.read:
	case <-ctx.Done():
	}
}

// TestAwaitBeforeIntercepts: right after a start, whether a host trusts a
// placeholder is known only once its credential is read; Await waits for that read
// (what the proxy does before it splices a tunnel), so Intercepts then says yes.
func TestAwaitBeforeIntercepts(t *testing.T) {
	c := pendingCreds{read: make(chan struct{}), creds: creds{"k": {Env: &credential.EnvVar{Value: "v",
		Locations: []string{"header"}, TrustedDomains: []string{"t.test"}}}}}
	r := New([]byte("await-key-await-key-await-key-aw"), "e", map[string]string{"K": "k"}, nil, c)
	if r.Intercepts("t.test") {
		t.Fatal("intercepts before the credential is read")
	}
	time.AfterFunc(100*time.Millisecond, func() { close(c.read) })
	r.Await(context.Background())
	if !r.Intercepts("t.test") {
		t.Error("after Await, t.test is still not known as the credential's trusted domain")
	}
}

package conformance_test

import (
	"net/http"
	"os"
	"testing"
	"time"
)

// maxStale is credentials.max_stale in the credential-failure worlds.
const maxStale = time.Second

// TestCredentialStoreFailures: when the credentials file is deleted or corrupted
// while egressd runs, the last good value is served until credentials.max_stale,
// then requests that need it get 503 credential_unavailable; no request ever
// reaches the upstream without the credential (the echo upstream counts them), and
// the file's content never reaches a log line.
func TestCredentialStoreFailures(t *testing.T) {
	damages := []struct {
		name   string
		damage func(path string) error
	}{
		{"credentials file deleted", os.Remove},
		{"credentials file corrupted", func(p string) error { return os.WriteFile(p, []byte("{not json"), 0o600) }},
		{"credentials file truncated in the middle of the secret", func(p string) error {
			good := goodCredentials()
			return os.WriteFile(p, []byte(good[:len(good)-len(secret)/2-6]), 0o600)
		}},
		{"credentials file emptied", func(p string) error { return os.WriteFile(p, nil, 0o600) }},
		{"credentials file replaced by a directory", func(p string) error {
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Mkdir(p, 0o700)
		}},
	}
	for _, tc := range damages {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, config{maxStale: maxStale.String()})
			k := w.begin(t)
			k.assertInjected(k.echo(k.get("https://api.allowed.test/before")).Header)
			if err := tc.damage(w.credPath); err != nil {
				t.Fatal(err)
			}
			damaged := time.Now()
			failedAfter := k.untilUnavailable(maxStale + 4*time.Second)
			t.Logf("credential_unavailable %v after the damage", failedAfter)
			if failedAfter < maxStale/2 {
				t.Errorf("the last good value was dropped after %v, before max_stale (%v)", failedAfter, maxStale)
			}
			for _, u := range []string{"https://api.allowed.test/after", "http://plain.allowed.test/after"} {
				k.refused(k.get(u), 503, "credential_unavailable", "")
			}
			k.echo(k.get("http://allowed.test/unaffected")) // entries without a credential are unaffected
			if time.Since(damaged) > maxStale+6*time.Second {
				t.Errorf("the case took %v", time.Since(damaged))
			}
			os.Remove(w.credPath)
			if err := os.WriteFile(w.credPath, []byte(goodCredentials()), 0o600); err != nil {
				t.Fatal(err)
			}
			k.untilAvailable(5 * time.Second)
		})
	}
	t.Run("credential ID removed from a file that parses", func(t *testing.T) {
		// An ID absent from a backend that answered is unavailable at once, without
		// waiting for max_stale (a minute here).
		w := newWorld(t, config{maxStale: "1m"})
		k := w.begin(t)
		k.assertInjected(k.echo(k.get("https://api.allowed.test/before")).Header)
		if err := os.WriteFile(w.credPath, []byte(`{"other": {"token": "not-this-one"}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if d := k.untilUnavailable(5 * time.Second); d > 4*time.Second {
			t.Errorf("unavailable only after %v", d)
		}
	})
	t.Run("credential with an invalid shape", func(t *testing.T) {
		w := newWorld(t, config{maxStale: "1m"})
		k := w.begin(t)
		k.assertInjected(k.echo(k.get("https://api.allowed.test/before")).Header)
		if err := os.WriteFile(w.credPath, []byte(`{"api": {"token": 42}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		k.untilUnavailable(5 * time.Second)
	})
}

// untilUnavailable sends requests to the credential host until one is refused with
// credential_unavailable, and returns how long that took. Every request served
// before must carry the credential exactly (the echo upstream counts those that did
// not, and the case fails on any).
func (k *kase) untilUnavailable(within time.Duration) time.Duration {
	k.t.Helper()
	start := time.Now()
	c := k.client()
	defer c.CloseIdleConnections()
	for time.Since(start) < within {
		resp, err := c.Get("https://api.allowed.test/during")
		if err != nil {
			k.t.Fatal(err)
		}
		if resp.StatusCode == http.StatusServiceUnavailable {
			k.refused(resp, 503, "credential_unavailable", "")
			return time.Since(start)
		}
		k.assertInjected(k.echo(resp).Header)
		time.Sleep(50 * time.Millisecond)
	}
	k.t.Fatalf("the credential was still served %v after the damage", within)
	return 0
}

// untilAvailable waits for the credential host to be served again with the
// credential.
func (k *kase) untilAvailable(within time.Duration) {
	k.t.Helper()
	start := time.Now()
	c := k.client()
	defer c.CloseIdleConnections()
	for time.Since(start) < within {
		resp, err := c.Get("https://api.allowed.test/restored")
		if err != nil {
			k.t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			k.assertInjected(k.echo(resp).Header)
			return
		}
		k.refused(resp, 503, "credential_unavailable", "")
		time.Sleep(100 * time.Millisecond)
	}
	k.t.Fatalf("the credential was not served again within %v of the file's repair", within)
}

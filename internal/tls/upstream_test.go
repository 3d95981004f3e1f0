package mitm

import (
	"os"
	"path/filepath"
	"testing"
)

// TestUpstreamRootsShared: Configs naming the same bundle share one root pool, a
// changed bundle gets a pool of its own that trusts it, and a file without a
// certificate is still refused.
func TestUpstreamRootsShared(t *testing.T) {
	dir := t.TempDir()
	bundle := filepath.Join(dir, "up.pem")
	pems := make([][]byte, 2)
	for i := range pems {
		ca, _, err := LoadOrCreateCA("", "", filepath.Join(dir, string(rune('a'+i))), "env_test")
		if err != nil {
			t.Fatal(err)
		}
		pems[i] = ca.CertPEM
	}
	write := func(b []byte) {
		if err := os.WriteFile(bundle, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(pems[0])
	a, err := UpstreamConfig(bundle)
	if err != nil {
		t.Fatal(err)
	}
	b, err := UpstreamConfig(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if a.RootCAs != b.RootCAs {
		t.Error("two Configs of one bundle hold a pool each")
	}
	if a == b {
		t.Error("two calls return one Config: a caller's change would reach the other")
	}
	write(pems[1])
	c, err := UpstreamConfig(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if c.RootCAs == a.RootCAs || c.RootCAs.Equal(a.RootCAs) {
		t.Error("a changed bundle is served the old pool")
	}
	write([]byte("no certificate here\n"))
	if _, err := UpstreamConfig(bundle); err == nil {
		t.Error("a bundle without a certificate is accepted")
	}
	write(nil)
	if _, err := UpstreamConfig(bundle); err == nil {
		t.Error("an empty bundle is accepted")
	}
}

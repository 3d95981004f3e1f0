package mitm

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pkcs12 "software.sslmate.com/src/go-pkcs12"
)

// bundleCerts parses every certificate in a PEM bundle, failing on junk.
func bundleCerts(t *testing.T, data []byte) []*x509.Certificate {
	t.Helper()
	var certs []*x509.Certificate
	for rest := data; len(bytes.TrimSpace(rest)) > 0; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil || block.Type != "CERTIFICATE" {
			t.Fatalf("bundle holds something other than certificates: %q", rest)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		certs = append(certs, c)
	}
	return certs
}

func countCA(certs []*x509.Certificate, ca *CA) int {
	n := 0
	for _, c := range certs {
		if bytes.Equal(c.Raw, ca.Cert.Raw) {
			n++
		}
	}
	return n
}

func TestWriteBundleWithSSLCertFile(t *testing.T) {
	dir := t.TempDir()
	other := testCA(t, time.Hour)
	roots := filepath.Join(dir, "roots.pem")
	writeFile(t, roots, append([]byte("# a comment line\n"), other.CertPEM...))
	t.Setenv("SSL_CERT_FILE", roots)

	state := filepath.Join(dir, "state")
	ca := testCA(t, caValidity)
	path, err := WriteBundle(ca, state)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(state, BundleName); path != want {
		t.Errorf("path %q, want %q", path, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode() != 0o644 {
		t.Errorf("bundle mode %v (err %v)", fi.Mode(), err)
	}
	certs := bundleCerts(t, mustRead(t, path))
	if len(certs) != 2 || !bytes.Equal(certs[0].Raw, other.Cert.Raw) || !bytes.Equal(certs[1].Raw, ca.Cert.Raw) {
		t.Fatalf("bundle holds %d certs, want [roots..., CA]", len(certs))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(mustRead(t, path)) {
		t.Fatal("bundle does not load into a CertPool")
	}

	// A CA already among the roots is not repeated.
	writeFile(t, roots, append(other.CertPEM, ca.CertPEM...))
	if _, err := WriteBundle(ca, state); err != nil {
		t.Fatal(err)
	}
	if got := countCA(bundleCerts(t, mustRead(t, path)), ca); got != 1 {
		t.Errorf("CA appears %d times", got)
	}
}

func TestWriteBundleSystemRoots(t *testing.T) {
	t.Setenv("SSL_CERT_FILE", "")
	system, err := SystemRootsPEM()
	if err != nil {
		t.Fatal(err)
	}
	ca := testCA(t, caValidity)
	state := t.TempDir()
	path, err := WriteBundle(ca, state)
	if err != nil {
		t.Fatal(err)
	}
	certs := bundleCerts(t, mustRead(t, path))
	if countCA(certs, ca) != 1 || !bytes.Equal(certs[len(certs)-1].Raw, ca.Cert.Raw) {
		t.Error("CA is not the bundle's last certificate")
	}
	if len(system) == 0 {
		t.Log("no system roots file on this machine: bundle holds the CA alone")
		if len(certs) != 1 {
			t.Errorf("bundle holds %d certs", len(certs))
		}
		return
	}
	if len(certs) < 2 {
		t.Errorf("bundle holds %d certs although %d bytes of system roots exist", len(certs), len(system))
	}

	// After `eval "$(egressd ca env)"`, SSL_CERT_FILE names the bundle itself:
	// rewriting it must not merge it into itself.
	t.Setenv("SSL_CERT_FILE", path)
	for range 2 {
		if _, err := WriteBundle(ca, state); err != nil {
			t.Fatal(err)
		}
	}
	again := bundleCerts(t, mustRead(t, path))
	if len(again) != len(certs) || countCA(again, ca) != 1 {
		t.Errorf("rewritten bundle: %d certs (was %d), CA %d times", len(again), len(certs), countCA(again, ca))
	}
}

func TestSystemRootsPEM(t *testing.T) {
	dir := t.TempDir()
	t.Run("SSL_CERT_FILE first", func(t *testing.T) {
		f := filepath.Join(dir, "r.pem")
		writeFile(t, f, []byte("roots"))
		t.Setenv("SSL_CERT_FILE", f)
		if got, err := SystemRootsPEM(); err != nil || string(got) != "roots" {
			t.Errorf("got %q, %v", got, err)
		}
	})
	t.Run("missing SSL_CERT_FILE falls back", func(t *testing.T) {
		t.Setenv("SSL_CERT_FILE", filepath.Join(dir, "missing.pem"))
		if _, err := SystemRootsPEM(); err != nil {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("unreadable SSL_CERT_FILE is an error", func(t *testing.T) {
		t.Setenv("SSL_CERT_FILE", dir) // a directory cannot be read as a file
		if _, err := SystemRootsPEM(); err == nil {
			t.Error("want an error")
		}
	})
	t.Run("none exists", func(t *testing.T) {
		saved := systemRootFiles
		t.Cleanup(func() { systemRootFiles = saved })
		systemRootFiles = []string{filepath.Join(dir, "nope")}
		t.Setenv("SSL_CERT_FILE", "")
		if got, err := SystemRootsPEM(); err != nil || len(got) != 0 {
			t.Errorf("got %d bytes, %v", len(got), err)
		}
	})
}

func TestClientEnv(t *testing.T) {
	env := ClientEnv(Public{Dir: "/s", Cert: "/s/ca.pem", Bundle: "/s/ca-bundle.pem", TrustStore: "/s/ca-truststore.p12"})
	want := []string{
		"SSL_CERT_FILE=/s/ca-bundle.pem",
		"REQUESTS_CA_BUNDLE=/s/ca-bundle.pem",
		"CURL_CA_BUNDLE=/s/ca-bundle.pem",
		"GIT_SSL_CAINFO=/s/ca-bundle.pem",
		"CARGO_HTTP_CAINFO=/s/ca-bundle.pem",
		"PIP_CERT=/s/ca-bundle.pem",
		"DENO_CERT=/s/ca-bundle.pem",
		"NODE_EXTRA_CA_CERTS=/s/ca.pem",
		"JAVA_TOOL_OPTIONS=-Djavax.net.ssl.trustStore=/s/ca-truststore.p12 -Djavax.net.ssl.trustStoreType=PKCS12 -Djavax.net.ssl.trustStorePassword=" + TrustStorePassword,
	}
	if !slices.Equal(env, want) {
		t.Errorf("ClientEnv:\n got %q\nwant %q", env, want)
	}
	// Every name docs/clients.md lists.
	for _, name := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "CARGO_HTTP_CAINFO", "PIP_CERT", "DENO_CERT"} {
		if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, name+"=") }) {
			t.Errorf("%s missing", name)
		}
	}
}

func TestWriteBundleStateDirMode(t *testing.T) {
	t.Setenv("SSL_CERT_FILE", "")
	state := filepath.Join(t.TempDir(), "new")
	if _, err := WriteBundle(testCA(t, caValidity), state); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(state); err != nil || fi.Mode() != fs.ModeDir|0o700 {
		t.Errorf("state dir mode %v (err %v)", fi.Mode(), err)
	}
}

// TestWritePublic: the public files are readable by every user (0644 in a 0755
// directory, reachable through a state dir that is searchable but not listable),
// the key stays 0600, and the trust store holds the bundle's certificates.
func TestWritePublic(t *testing.T) {
	dir := t.TempDir()
	other := testCA(t, time.Hour)
	roots := filepath.Join(dir, "roots.pem")
	writeFile(t, roots, other.CertPEM)
	t.Setenv("SSL_CERT_FILE", roots)
	state := filepath.Join(dir, "state")
	ca, _, err := LoadOrCreateCA("", "", state, "env_pub")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := WritePublic(ca, filepath.Join(state, "ca"), state)
	if err != nil {
		t.Fatal(err)
	}
	mode := func(p string) fs.FileMode {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	for p, want := range map[string]fs.FileMode{pub.Dir: 0o755, pub.Cert: 0o644, pub.Bundle: 0o644, pub.TrustStore: 0o644,
		state: 0o711, filepath.Join(state, CAKeyName): 0o600} {
		if got := mode(p); got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
	}
	data, err := os.ReadFile(pub.TrustStore)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pkcs12.DecodeTrustStore(data, TrustStorePassword)
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != 2 || countCA(certs, ca) != 1 {
		t.Errorf("trust store holds %d certificates, want the root and the CA", len(certs))
	}
	// A public dir outside the state dir leaves the state dir as it was.
	os.Chmod(state, 0o700)
	if _, err := WritePublic(ca, filepath.Join(dir, "public"), state); err != nil || mode(state) != 0o700 {
		t.Errorf("public dir outside: %v, state dir %v", err, mode(state))
	}
}

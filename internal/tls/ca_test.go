package mitm

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadOrCreateCACreatesThenLoads(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state") // does not exist yet
	ca, created, err := LoadOrCreateCA("", "", state, "env_demo")
	if err != nil || !created {
		t.Fatalf("first call: created=%v err=%v", created, err)
	}
	for path, want := range map[string]fs.FileMode{
		state:                              0o700 | fs.ModeDir,
		filepath.Join(state, "ca-key.pem"): 0o600,
		filepath.Join(state, "ca.pem"):     0o644,
	} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v (err %v)", path, fi.Mode(), want, err)
		}
	}
	if tmps, _ := filepath.Glob(filepath.Join(state, ".*.tmp")); len(tmps) > 0 {
		t.Errorf("temp files left behind: %v", tmps)
	}
	if want := filepath.Join(state, "ca.pem"); ca.CertFile != want || !filepath.IsAbs(ca.CertFile) {
		t.Errorf("CertFile %q, want %q", ca.CertFile, want)
	}

	c := ca.Cert
	if c.Subject.CommonName != "egressd interception CA (env_demo)" || len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != "egressd" {
		t.Errorf("subject %v", c.Subject)
	}
	if !c.IsCA || !c.BasicConstraintsValid || c.MaxPathLen != 0 || !c.MaxPathLenZero {
		t.Errorf("basic constraints: IsCA %v valid %v MaxPathLen %d zero %v", c.IsCA, c.BasicConstraintsValid, c.MaxPathLen, c.MaxPathLenZero)
	}
	if c.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("key usage %b", c.KeyUsage)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", c.PublicKey)
	}
	if len(c.SubjectKeyId) != 20 || c.SerialNumber.Sign() <= 0 || c.SerialNumber.BitLen() > 129 {
		t.Errorf("SubjectKeyId %x serial %v", c.SubjectKeyId, c.SerialNumber)
	}
	now := time.Now()
	if d := now.Sub(c.NotBefore); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("NotBefore %v is not an hour ago", c.NotBefore)
	}
	if d := c.NotAfter.Sub(now); d < 729*24*time.Hour || d > 731*24*time.Hour {
		t.Errorf("NotAfter %v is not two years ahead", c.NotAfter)
	}
	if !bytes.Equal(ca.CertPEM, mustRead(t, filepath.Join(state, "ca.pem"))) {
		t.Error("CertPEM differs from ca.pem")
	}

	again, created, err := LoadOrCreateCA("", "", state, "env_demo")
	if err != nil || created {
		t.Fatalf("second call: created=%v err=%v", created, err)
	}
	if !bytes.Equal(again.Cert.SubjectKeyId, c.SubjectKeyId) || !bytes.Equal(again.Cert.Raw, c.Raw) {
		t.Error("second call loaded a different CA")
	}
	if !publicKeysEqual(again.Key.Public(), ca.Key.Public()) {
		t.Error("second call loaded a different key")
	}
}

func TestLoadOrCreateCAConfiguredPair(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writeTestCA(t, dir, caTemplate(), "PRIVATE KEY", newECKey(t))
	ca, created, err := LoadOrCreateCA(certFile, keyFile, filepath.Join(dir, "unused"), "e")
	if err != nil || created {
		t.Fatalf("created=%v err=%v", created, err)
	}
	if ca.CertFile != certFile {
		t.Errorf("CertFile %q", ca.CertFile)
	}
	if _, err := os.Stat(filepath.Join(dir, "unused")); !errors.Is(err, fs.ErrNotExist) {
		t.Error("a configured CA must not touch the state dir")
	}
}

func TestLoadCAKeyFormats(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pemType string
		key     crypto.Signer
	}{
		{"PRIVATE KEY", newECKey(t)},
		{"EC PRIVATE KEY", newECKey(t)},
		{"RSA PRIVATE KEY", rsaKey},
		{"PRIVATE KEY", rsaKey},
	} {
		t.Run(tc.pemType, func(t *testing.T) {
			certFile, keyFile := writeTestCA(t, t.TempDir(), caTemplate(), tc.pemType, tc.key)
			ca, err := LoadCA(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			// The loaded CA must be able to sign leaves that verify.
			leaf, err := mintLeaf(ca, "example.com", time.Now(), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			verifyLeaf(t, ca, leaf.Leaf, "example.com")
		})
	}
}

func TestLoadCAEcParametersBlockFirst(t *testing.T) {
	// `openssl ecparam -genkey` writes an EC PARAMETERS block before the key.
	dir := t.TempDir()
	certFile, keyFile := writeTestCA(t, dir, caTemplate(), "EC PRIVATE KEY", newECKey(t))
	params := pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}})
	if err := os.WriteFile(keyFile, append(params, mustRead(t, keyFile)...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
}

func TestLoadCARejects(t *testing.T) {
	key := newECKey(t)
	notCA := caTemplate()
	notCA.IsCA = false
	noCertSign := caTemplate()
	noCertSign.KeyUsage = x509.KeyUsageDigitalSignature
	expired := caTemplate()
	expired.NotBefore, expired.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)

	for _, tc := range []struct {
		name    string
		setup   func(dir string) (certFile, keyFile string)
		wantMsg string
	}{
		{"not a CA", func(dir string) (string, string) {
			return writeTestCA(t, dir, notCA, "PRIVATE KEY", key)
		}, "is not a CA"},
		{"no keyCertSign", func(dir string) (string, string) {
			return writeTestCA(t, dir, noCertSign, "PRIVATE KEY", key)
		}, "may not sign certificates"},
		{"expired", func(dir string) (string, string) {
			return writeTestCA(t, dir, expired, "PRIVATE KEY", key)
		}, "expired at"},
		{"key does not match", func(dir string) (string, string) {
			certFile, _ := writeTestCA(t, dir, caTemplate(), "PRIVATE KEY", key)
			_, otherKey := writeTestCA(t, filepath.Join(dir, "other"), caTemplate(), "PRIVATE KEY", newECKey(t))
			return certFile, otherKey
		}, "does not match"},
		{"no certificate", func(dir string) (string, string) {
			certFile, keyFile := writeTestCA(t, dir, caTemplate(), "PRIVATE KEY", key)
			writeFile(t, certFile, []byte("not pem"))
			return certFile, keyFile
		}, "no PEM CERTIFICATE"},
		{"no key", func(dir string) (string, string) {
			certFile, _ := writeTestCA(t, dir, caTemplate(), "PRIVATE KEY", key)
			return certFile, certFile
		}, "no PEM private key"},
		{"encrypted key", func(dir string) (string, string) {
			certFile, keyFile := writeTestCA(t, dir, caTemplate(), "PRIVATE KEY", key)
			writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1, 2, 3}}))
			return certFile, keyFile
		}, "encrypted"},
		{"corrupt key", func(dir string) (string, string) {
			certFile, keyFile := writeTestCA(t, dir, caTemplate(), "PRIVATE KEY", key)
			writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte("SECRETSECRET")}))
			return certFile, keyFile
		}, "EC PRIVATE KEY block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certFile, keyFile := tc.setup(t.TempDir())
			keyPEM := mustRead(t, keyFile)
			_, err := LoadCA(certFile, keyFile)
			if !errors.Is(err, ErrInvalidCA) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("err = %v, want ErrInvalidCA containing %q", err, tc.wantMsg)
			}
			for line := range strings.Lines(string(keyPEM)) {
				if line = strings.TrimSpace(line); !strings.HasPrefix(line, "-----") && len(line) > 8 && strings.Contains(err.Error(), line) {
					t.Error("error contains key material")
				}
			}
			if strings.Contains(err.Error(), "SECRETSECRET") {
				t.Error("error contains key bytes")
			}
		})
	}
}

func TestLoadOrCreateCAHalfPairs(t *testing.T) {
	t.Run("config names one file", func(t *testing.T) {
		for _, pair := range [][2]string{{"ca.pem", ""}, {"", "ca-key.pem"}} {
			_, _, err := LoadOrCreateCA(pair[0], pair[1], t.TempDir(), "e")
			if !errors.Is(err, ErrInvalidCA) {
				t.Errorf("%q: err = %v", pair, err)
			}
		}
	})
	for _, missing := range []string{CACertName, CAKeyName} {
		t.Run("state dir without "+missing, func(t *testing.T) {
			state := t.TempDir()
			if _, _, err := LoadOrCreateCA("", "", state, "e"); err != nil {
				t.Fatal(err)
			}
			kept := mustRead(t, filepath.Join(state, otherHalf(missing)))
			if err := os.Remove(filepath.Join(state, missing)); err != nil {
				t.Fatal(err)
			}
			_, created, err := LoadOrCreateCA("", "", state, "e")
			if !errors.Is(err, ErrInvalidCA) || created || !strings.Contains(err.Error(), missing) {
				t.Fatalf("created=%v err=%v", created, err)
			}
			if !bytes.Equal(kept, mustRead(t, filepath.Join(state, otherHalf(missing)))) {
				t.Error("the remaining half was overwritten")
			}
		})
	}
	t.Run("missing configured file is an I/O error", func(t *testing.T) {
		dir := t.TempDir()
		_, _, err := LoadOrCreateCA(filepath.Join(dir, "nope.pem"), filepath.Join(dir, "nope-key.pem"), dir, "e")
		if err == nil || errors.Is(err, ErrInvalidCA) || !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("no state dir", func(t *testing.T) {
		if _, _, err := LoadOrCreateCA("", "", "", "e"); err == nil {
			t.Fatal("want an error")
		}
	})
}

func otherHalf(name string) string {
	if name == CACertName {
		return CAKeyName
	}
	return CACertName
}

// caTemplate is a valid CA template for LoadCA tests, valid for a year.
func caTemplate() *x509.Certificate {
	return &x509.Certificate{
		SerialNumber:          big.NewInt(42),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		BasicConstraintsValid: true,
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
}

// writeTestCA self-signs tmpl with key and writes dir/ca.pem and dir/ca-key.pem,
// the key as a pemType block.
func writeTestCA(t *testing.T, dir string, tmpl *x509.Certificate, pemType string, key crypto.Signer) (string, string) {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	var keyDER []byte
	switch pemType {
	case "PRIVATE KEY":
		keyDER, err = x509.MarshalPKCS8PrivateKey(key)
	case "EC PRIVATE KEY":
		keyDER, err = x509.MarshalECPrivateKey(key.(*ecdsa.PrivateKey))
	case "RSA PRIVATE KEY":
		keyDER = x509.MarshalPKCS1PrivateKey(key.(*rsa.PrivateKey))
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	writeFile(t, certFile, encodeCert(der))
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: keyDER}))
	return certFile, keyFile
}

func newECKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

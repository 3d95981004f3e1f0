package mitm

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	pkcs12 "software.sslmate.com/src/go-pkcs12"

	"github.com/egressd/egressd/internal/atomicfile"
)

// The public files of the CA, in its public directory (tls.ca_public_dir), which
// every user may read: the sandbox's clients run as other users than egressd.
const (
	PublicCertName = "ca.pem"            // the CA certificate alone (NODE_EXTRA_CA_CERTS)
	BundleName     = "ca-bundle.pem"     // system roots + the CA (SSL_CERT_FILE and the rest)
	TrustStoreName = "ca-truststore.p12" // the same as a PKCS#12 trust store (Java)
	// TrustStorePassword is the trust store's password. It protects nothing (the
	// store holds public certificates only); Java's PKCS#12 reader wants one to
	// check the store's integrity.
	TrustStorePassword = "egressd-public"
)

// Public is where WritePublic put the CA's public files (absolute paths).
type Public struct {
	Dir, Cert, Bundle, TrustStore string
}

// WritePublic writes the CA's public files into dir, created 0755 with files 0644
// so that every user can read them: the CA certificate, the merged bundle
// (WriteBundle) and the PKCS#12 trust store of the same certificates. When dir is
// inside within (the state dir, which holds the private key), within gets search
// permission for all (0711: others may pass through it to dir, never list it; every
// secret in it is a 0600 file).
func WritePublic(ca *CA, dir, within string) (Public, error) {
	dir = absPath(dir)
	pub := Public{Dir: dir, Cert: filepath.Join(dir, PublicCertName), Bundle: filepath.Join(dir, BundleName),
		TrustStore: filepath.Join(dir, TrustStoreName)}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return pub, fmt.Errorf("CA public dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return pub, fmt.Errorf("CA public dir: %w", err)
	}
	if err := openPath(absPath(within), dir); err != nil {
		return pub, err
	}
	if err := atomicfile.Write(pub.Cert, ca.CertPEM, 0o644); err != nil {
		return pub, fmt.Errorf("CA certificate: %w", err)
	}
	bundle, err := WriteBundle(ca, dir)
	if err != nil {
		return pub, err
	}
	data, err := os.ReadFile(bundle)
	if err != nil {
		return pub, err
	}
	store, err := trustStore(data)
	if err != nil {
		return pub, err
	}
	if err := atomicfile.Write(pub.TrustStore, store, 0o644); err != nil {
		return pub, fmt.Errorf("CA trust store: %w", err)
	}
	return pub, nil
}

// openPath gives within, and every directory between it and dir, search
// permission for all, when dir is inside within.
func openPath(within, dir string) error {
	rel, err := filepath.Rel(within, dir)
	if within == "" || err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("CA public dir: %w", err)
		}
		if fi.Mode().Perm()&0o011 != 0o011 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o011); err != nil {
				return fmt.Errorf("CA public dir: %s must be searchable by every user: %w", d, err)
			}
		}
		if d == within || d == filepath.Dir(d) {
			return nil
		}
	}
}

// trustStore encodes every certificate of a PEM bundle as a PKCS#12 trust store
// (go-pkcs12's modern encoding: AES-256 and a SHA-256 MAC, which Java 11.0.12 and
// later read), for javax.net.ssl.trustStore.
func trustStore(bundle []byte) ([]byte, error) {
	var certs []*x509.Certificate
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			certs = append(certs, c)
		}
	}
	store, err := pkcs12.Modern.EncodeTrustStore(certs, TrustStorePassword)
	if err != nil {
		return nil, fmt.Errorf("CA trust store: %w", err)
	}
	return store, nil
}

// systemRootFiles are Go's documented Linux root bundle locations
// (crypto/x509/root_linux.go), in its order.
var systemRootFiles = []string{
	"/etc/ssl/certs/ca-certificates.crt",                // Debian/Ubuntu/Gentoo etc.
	"/etc/pki/tls/certs/ca-bundle.crt",                  // Fedora/RHEL 6
	"/etc/ssl/ca-bundle.pem",                            // OpenSUSE
	"/etc/pki/tls/cacert.pem",                           // OpenELEC
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS/RHEL 7
	"/etc/ssl/cert.pem",                                 // Alpine Linux
}

// SystemRootsPEM returns the system roots as PEM, read from SSL_CERT_FILE if
// it is set and exists, else from the first of Go's documented Linux locations
// that exists. It is empty, not an error, when none does. (SSL_CERT_DIR is not
// read: the clients this bundle is for take one file.)
func SystemRootsPEM() ([]byte, error) {
	return systemRootsPEM("")
}

// systemRootsPEM is SystemRootsPEM skipping the file skip, so a bundle that
// SSL_CERT_FILE already points at (after `eval "$(egressd ca env)"`) is not
// merged into itself.
func systemRootsPEM(skip string) ([]byte, error) {
	files := systemRootFiles
	if f := os.Getenv("SSL_CERT_FILE"); f != "" {
		files = append([]string{f}, files...)
	}
	for _, f := range files {
		if skip != "" && sameFile(f, skip) {
			continue
		}
		data, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("system roots: %w", err)
		}
		return data, nil
	}
	return nil, nil
}

// WriteBundle writes dir/ca-bundle.pem, the system roots followed by the
// CA's certificate, atomically with mode 0644, and returns its absolute path.
// Copies of the CA already among the roots are dropped, so rewriting the
// bundle never grows it.
func WriteBundle(ca *CA, dir string) (string, error) {
	path := absPath(filepath.Join(dir, BundleName))
	roots, err := systemRootsPEM(path)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("state dir: %w", err)
	}
	if err := atomicfile.Write(path, mergeBundle(roots, ca), 0o644); err != nil {
		return "", fmt.Errorf("CA bundle: %w", err)
	}
	return path, nil
}

// mergeBundle re-encodes the CERTIFICATE blocks of roots, without any copy of
// ca, and appends ca's PEM.
func mergeBundle(roots []byte, ca *CA) []byte {
	var out bytes.Buffer
	out.Grow(len(roots) + len(ca.CertPEM))
	for rest := roots; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type == "CERTIFICATE" && !bytes.Equal(block.Bytes, ca.Cert.Raw) {
			pem.Encode(&out, &pem.Block{Type: block.Type, Bytes: block.Bytes}) // bytes.Buffer writes cannot fail
		}
	}
	out.Write(ca.CertPEM)
	return out.Bytes()
}

// ClientEnv returns "NAME=value" assignments that make common clients trust
// egressd: SSL_CERT_FILE (OpenSSL, Go, Ruby), REQUESTS_CA_BUNDLE (Python
// requests), CURL_CA_BUNDLE, GIT_SSL_CAINFO, CARGO_HTTP_CAINFO, PIP_CERT and
// DENO_CERT name the merged bundle, since each replaces its roots with the
// file; NODE_EXTRA_CA_CERTS names the CA alone, since Node adds it to its own;
// JAVA_TOOL_OPTIONS makes every JVM use the PKCS#12 trust store (the same
// certificates as the bundle) in place of its cacerts.
func ClientEnv(pub Public) []string {
	env := make([]string, 0, 9)
	for _, name := range []string{
		"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
		"CARGO_HTTP_CAINFO", "PIP_CERT", "DENO_CERT",
	} {
		env = append(env, name+"="+pub.Bundle)
	}
	return append(env, "NODE_EXTRA_CA_CERTS="+pub.Cert,
		"JAVA_TOOL_OPTIONS=-Djavax.net.ssl.trustStore="+pub.TrustStore+" -Djavax.net.ssl.trustStoreType=PKCS12"+
			" -Djavax.net.ssl.trustStorePassword="+TrustStorePassword)
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

package mitm

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/egressd/egressd/internal/atomicfile"
)

// BundleName is the merged bundle's file name inside the state dir.
const BundleName = "ca-bundle.pem"

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

// WriteBundle writes stateDir/ca-bundle.pem, the system roots followed by the
// CA's certificate, atomically with mode 0644, and returns its absolute path.
// Copies of the CA already among the roots are dropped, so rewriting the
// bundle never grows it.
func WriteBundle(ca *CA, stateDir string) (string, error) {
	path := absPath(filepath.Join(stateDir, BundleName))
	roots, err := systemRootsPEM(path)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
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
// file; NODE_EXTRA_CA_CERTS names the CA alone, since Node adds it to its own.
func ClientEnv(bundlePath, caPath string) []string {
	env := make([]string, 0, 8)
	for _, name := range []string{
		"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
		"CARGO_HTTP_CAINFO", "PIP_CERT", "DENO_CERT",
	} {
		env = append(env, name+"="+bundlePath)
	}
	return append(env, "NODE_EXTRA_CA_CERTS="+caPath)
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

package mitm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/egressd/egressd/internal/atomicfile"
)

// Names of the generated CA's files inside the state dir.
const (
	CACertName = "ca.pem"
	CAKeyName  = "ca-key.pem"
)

// caValidity is how long a generated CA is valid. Two years: long enough that a
// sandbox image baked with it keeps working, short enough to be rotated.
const caValidity = 2 * 365 * 24 * time.Hour

// backdate is how far before "now" generated certificates start, so a client
// whose clock runs behind still accepts them.
const backdate = time.Hour

// ErrInvalidCA marks a CA that was read but cannot be used: bad PEM, not a CA,
// a key that does not match, an expired certificate. Other LoadCA and
// LoadOrCreateCA errors are I/O failures. Test with errors.Is.
var ErrInvalidCA = errors.New("invalid interception CA")

// CA is egressd's interception CA. Never goproxy's or any built-in CA: leaves
// are signed only by a CA the operator configured or egressd generated.
type CA struct {
	Cert     *x509.Certificate
	Key      crypto.Signer
	CertPEM  []byte // Cert alone, PEM-encoded: what clients trust (/ca.pem)
	CertFile string // absolute path of the PEM (for ca env and /ca.pem)
}

// LoadCA reads a PEM certificate and a PEM private key (PKCS#8, SEC 1 EC or
// PKCS#1 RSA). The certificate must be a CA allowed to sign certificates, not
// expired, and match the key. Errors name the files, never key material.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	cert, err := parseCACert(certPEM, time.Now())
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidCA, certFile, err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidCA, keyFile, err)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("%w: the key in %s does not match the certificate in %s", ErrInvalidCA, keyFile, certFile)
	}
	return &CA{Cert: cert, Key: key, CertPEM: encodeCert(cert.Raw), CertFile: absPath(certFile)}, nil
}

// LoadOrCreateCA returns the configured CA (certFile and keyFile both set) or
// the one in stateDir (both empty): loaded when ca.pem and ca-key.pem exist,
// generated and written there when neither does (created is then true). env
// names the CA's subject. Exactly one of a pair present is an error: egressd
// never overwrites a half of a CA.
//
// Two processes creating a CA in the same empty state dir at once may each
// publish one half; run `egressd ca init` before starting several.
func LoadOrCreateCA(certFile, keyFile, stateDir, env string) (ca *CA, created bool, err error) {
	if ca, err = LoadExistingCA(certFile, keyFile, stateDir); ca != nil || err != nil {
		return ca, false, err
	}
	ca, err = createCA(filepath.Join(stateDir, CACertName), filepath.Join(stateDir, CAKeyName), env)
	return ca, err == nil, err
}

// LoadExistingCA is LoadOrCreateCA without the create: it returns the same CA
// or the same error, and a nil CA with no error where LoadOrCreateCA would
// generate one (stateDir holds neither half). `egressd check` calls it, so it
// refuses what run refuses without writing anything.
func LoadExistingCA(certFile, keyFile, stateDir string) (*CA, error) {
	switch {
	case certFile != "" && keyFile != "":
		return LoadCA(certFile, keyFile)
	case certFile != "" || keyFile != "":
		return nil, fmt.Errorf("%w: tls.ca_cert and tls.ca_key must be set together (or both left empty to use the state dir)", ErrInvalidCA)
	case stateDir == "":
		return nil, errors.New("no state dir to keep the generated CA in")
	}
	certFile, keyFile = filepath.Join(stateDir, CACertName), filepath.Join(stateDir, CAKeyName)
	certOK, err := exists(certFile)
	if err != nil {
		return nil, err
	}
	keyOK, err := exists(keyFile)
	if err != nil {
		return nil, err
	}
	switch {
	case certOK && keyOK:
		return LoadCA(certFile, keyFile)
	case certOK:
		return nil, fmt.Errorf("%w: %s exists but %s does not; restore the key or remove both to generate a new CA", ErrInvalidCA, certFile, keyFile)
	case keyOK:
		return nil, fmt.Errorf("%w: %s exists but %s does not; restore the certificate or remove both to generate a new CA", ErrInvalidCA, keyFile, certFile)
	}
	return nil, nil
}

// createCA generates a CA and writes it: the key first (0600), then the
// certificate (0644), each through a temp file and a rename.
func createCA(certFile, keyFile, env string) (*CA, error) {
	if err := os.MkdirAll(filepath.Dir(certFile), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	ca, keyDER, err := newCA(env, time.Now(), caValidity)
	if err != nil {
		return nil, err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := atomicfile.Write(keyFile, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if err := atomicfile.Write(certFile, ca.CertPEM, 0o644); err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	ca.CertFile = absPath(certFile)
	return ca, nil
}

// newCA generates an ECDSA P-256 CA valid from now-backdate for validity. It
// also returns the key as PKCS#8 DER.
func newCA(env string, now time.Time, validity time.Duration) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	skid, err := subjectKeyID(key.Public())
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:   fmt.Sprintf("egressd interception CA (%s)", env),
			Organization: []string{"egressd"},
		},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true, // leaves only: no intermediate can be made from it
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		SubjectKeyId:          skid,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: encodeCert(der)}, keyDER, nil
}

// parseCACert returns the first CERTIFICATE in data after checking that it can
// sign leaves at now.
func parseCACert(data []byte, now time.Time) (*x509.Certificate, error) {
	block := firstBlock(data, "CERTIFICATE")
	if block == nil {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	switch {
	case !cert.BasicConstraintsValid || !cert.IsCA:
		return nil, fmt.Errorf("certificate %q is not a CA (basicConstraints CA:TRUE missing)", cert.Subject.CommonName)
	case cert.KeyUsage&x509.KeyUsageCertSign == 0:
		return nil, fmt.Errorf("certificate %q may not sign certificates (keyUsage keyCertSign missing)", cert.Subject.CommonName)
	case now.After(cert.NotAfter):
		return nil, fmt.Errorf("certificate %q expired at %s", cert.Subject.CommonName, cert.NotAfter.Format(time.RFC3339))
	}
	return cert, nil
}

// parseKey reads the first private key block: PKCS#8, SEC 1 EC or PKCS#1 RSA.
// Errors never include the key's bytes.
func parseKey(data []byte) (crypto.Signer, error) {
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("no PEM private key block (PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY)")
		}
		var key any
		var err error
		switch block.Type {
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		case "ENCRYPTED PRIVATE KEY":
			return nil, errors.New("the private key is encrypted; egressd needs it unencrypted (openssl pkcs8 -topk8 -nocrypt)")
		default:
			continue // EC PARAMETERS from `openssl ecparam -genkey`, certificates, ...
		}
		if err != nil {
			return nil, fmt.Errorf("%s block: %v", block.Type, err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s block: %T cannot sign", block.Type, key)
		}
		return signer, nil
	}
}

func firstBlock(data []byte, typ string) *pem.Block {
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil || block.Type == typ {
			return block
		}
	}
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// serialLimit bounds serial numbers to 128 random bits (CA/B Forum asks for at
// least 64; RFC 5280 allows up to 20 octets).
var serialLimit = new(big.Int).Lsh(big.NewInt(1), 128)

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, serialLimit)
	if err != nil {
		return nil, err
	}
	return n.Add(n, big.NewInt(1)), nil // never zero: serials are positive
}

// subjectKeyID is RFC 7093 section 2 method 1: the leftmost 160 bits of the
// SHA-256 of the subjectPublicKey BIT STRING.
func subjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	spki, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	var info struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	if _, err := asn1.Unmarshal(spki, &info); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(info.PublicKey.Bytes)
	return sum[:20], nil
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// absPath makes path absolute so it still means the same file in the shell
// that evaluates `egressd ca env`; on the rare Getwd failure it stays as given.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

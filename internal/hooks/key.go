package hooks

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/egressd/egressd/internal/atomicfile"
)

// KeyFileName is the signing key egressd generates in state_dir when hooks.signing_key
// names neither a file nor a credential.
const KeyFileName = "hook-signing-key.pem"

// pemType is the PEM block type of a PKCS#8 private key (RFC 5958, RFC 8410).
const pemType = "PRIVATE KEY"

// ParseKeyPEM reads a PEM PKCS#8 Ed25519 private key ("-----BEGIN PRIVATE KEY-----").
// Errors never quote the key.
func ParseKeyPEM(data []byte) (ed25519.PrivateKey, error) {
	block, rest := pem.Decode(data)
	switch {
	case block == nil:
		return nil, errors.New("no PEM block; expected a PKCS#8 Ed25519 key (-----BEGIN PRIVATE KEY-----)")
	case block.Type != pemType:
		return nil, fmt.Errorf("PEM block %q; expected a PKCS#8 Ed25519 key (%s); convert with `openssl pkcs8 -topk8 -nocrypt`", block.Type, pemType)
	case strings.TrimSpace(string(rest)) != "":
		return nil, errors.New("data after the PEM block; keep one key per file")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("not a PKCS#8 private key: %v", err)
	}
	ed, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an Ed25519 key; generate one with `openssl genpkey -algorithm ed25519`", k)
	}
	return ed, nil
}

// MarshalKeyPEM encodes k as PEM PKCS#8.
func MarshalKeyPEM(k ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der}), nil
}

// LoadKeyFile reads hooks.signing_key.file.
func LoadKeyFile(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("hook signing key: %w", err)
	}
	k, err := ParseKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("hook signing key %s: %w", path, err)
	}
	return k, nil
}

// LoadExistingKey is LoadOrCreateKey without the create: the same key or the
// same error, and a nil key with no error where LoadOrCreateKey would generate
// one. `egressd check` calls it, so it refuses what run refuses without writing.
func LoadExistingKey(stateDir string) (key ed25519.PrivateKey, path string, err error) {
	if stateDir == "" {
		return nil, "", errors.New("hook signing key: no state dir to keep the generated key in")
	}
	path = filepath.Join(stateDir, KeyFileName)
	if key, err = LoadKeyFile(path); errors.Is(err, fs.ErrNotExist) {
		return nil, path, nil
	}
	return key, path, err
}

// LoadOrCreateKey returns the key in stateDir/KeyFileName, generating it (mode 0600, in
// a directory created 0700) on first start. created says whether it was generated. Two
// processes starting at once agree on one key: the file is published with a hard link,
// which never replaces an existing file.
func LoadOrCreateKey(stateDir string) (key ed25519.PrivateKey, path string, created bool, err error) {
	if key, path, err = LoadExistingKey(stateDir); key != nil || err != nil {
		return key, path, false, err
	}
	if err = os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, path, false, fmt.Errorf("hook signing key: state dir: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, path, false, err
	}
	data, err := MarshalKeyPEM(priv)
	if err != nil {
		return nil, path, false, err
	}
	switch err = atomicfile.Create(path, data, 0o600); {
	case errors.Is(err, fs.ErrExist): // another process won the race: use its key
		key, err = LoadKeyFile(path)
		return key, path, false, err
	case err != nil:
		return nil, path, false, fmt.Errorf("hook signing key: %w", err)
	}
	return priv, path, true, nil
}

// FileCheckInterval is how often a file-held signing key is looked at for a change.
const FileCheckInterval = time.Second

// keyFile is a followed key file: its stat when last read, and when it was last looked at.
type keyFile struct {
	path    string
	mu      sync.Mutex
	checked time.Time
	stat    fileStat
	err     error // of the last read that failed; the key before it stays in use
}

type fileStat struct {
	size, mtime int64
}

func statOf(fi fs.FileInfo) fileStat { return fileStat{fi.Size(), fi.ModTime().UnixNano()} }

// newFileSigner signs with the key in path and follows the file.
func newFileSigner(path string) (*Signer, error) {
	k, err := LoadKeyFile(path)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("hook signing key: %w", err)
	}
	s, err := NewSigner(k)
	if err != nil {
		return nil, err
	}
	s.file = &keyFile{path: path, checked: time.Now(), stat: statOf(fi)}
	return s, nil
}

// followFile re-reads the key file when its size or mtime changed, at most every
// FileCheckInterval, and rotates to its key. A file that cannot be read or parsed
// keeps the current key (it was good, and the file may be mid-replacement).
func (s *Signer) followFile() error {
	f := s.file
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if now.Sub(f.checked) < FileCheckInterval {
		return nil
	}
	f.checked = now
	fi, err := os.Stat(f.path)
	if err != nil || statOf(fi) == f.stat {
		return nil
	}
	priv, err := LoadKeyFile(f.path)
	if err != nil {
		f.err = err
		return nil
	}
	if err := s.Rotate(priv); err != nil {
		return nil
	}
	f.stat, f.err = statOf(fi), nil
	return nil
}

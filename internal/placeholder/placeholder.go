// Package placeholder stands in for environment_variable credentials: the sandbox's
// environment holds a placeholder (egressd_ph_<id>_<32 hex>), never the value, and egressd
// swaps the value in on the way out, in the credential's named locations of requests to its
// trusted domains only. A placeholder seen anywhere else egressd can see is refused with
// credential_scope and nothing is forwarded.
//
// Placeholders are derived with HMAC-SHA256 under a random key kept in the state dir
// (created 0600 on first use): stable for an environment and credential across reloads
// and restarts, unguessable without the key, and worthless outside egressd.
package placeholder

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/egressd/egressd/internal/atomicfile"
)

// Prefix starts every placeholder: it makes them recognisable in logs and quick to look for.
const Prefix = "egressd_ph_"

// KeyFile is the name of the derivation key in the state dir.
const KeyFile = "placeholder.key"

const (
	keyBytes    = 32
	randomChars = 32 // hex digits of the HMAC in a placeholder (128 bits)
)

// LoadKey reads the derivation key from stateDir, creating it (0600, random) on first use.
// Of two processes creating it at once, both end up with the one that was written first.
func LoadKey(stateDir string) ([]byte, error) {
	path := filepath.Join(stateDir, KeyFile)
	if key, err := readKey(path); !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("placeholder key: %w", err)
	}
	key := make([]byte, keyBytes)
	rand.Read(key)
	err := atomicfile.Create(path, []byte(hex.EncodeToString(key)+"\n"), 0o600)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("placeholder key: %w", err)
	}
	return readKey(path)
}

func readKey(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(key) != keyBytes {
		return nil, fmt.Errorf("placeholder key %s: not %d hex-encoded bytes; remove it to make a new one (every placeholder changes)", path, keyBytes)
	}
	return key, nil
}

// Derive returns the placeholder of credential id in environment env.
func Derive(key []byte, env, id string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(env))
	mac.Write([]byte{0})
	mac.Write([]byte(id))
	return Prefix + id + "_" + hex.EncodeToString(mac.Sum(nil))[:randomChars]
}

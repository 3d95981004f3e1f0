package hookauth

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// maxJWKSBytes bounds a fetched JWKS document; egressd's holds two keys.
const maxJWKSBytes = 1 << 20

// jwk is the part of an RFC 7517 key this package reads.
type jwk struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
}

// ParseJWKS returns the Ed25519 signing keys of a JWKS document ({"keys": [...]}) by kid.
// Keys of other types or uses, and keys without a kid, are skipped (a JWKS may hold
// keys for other purposes); a document with no usable key is an error.
func ParseJWKS(data []byte) (map[string]ed25519.PublicKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("JWKS is not a JSON key set: %w", err)
	}
	keys := map[string]ed25519.PublicKey{}
	for _, raw := range set.Keys {
		var k jwk
		if json.Unmarshal(raw, &k) != nil || !k.usable() {
			continue
		}
		x, err := base64.RawURLEncoding.DecodeString(k.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("JWKS key %q: x is not a base64url Ed25519 public key", k.Kid)
		}
		keys[k.Kid] = ed25519.PublicKey(x)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("JWKS has no Ed25519 signing key with a kid")
	}
	return keys, nil
}

// usable reports whether k is an Ed25519 key for signatures (RFC 8037), with a kid.
func (k jwk) usable() bool {
	return k.Kty == "OKP" && k.Crv == "Ed25519" && k.Kid != "" &&
		(k.Use == "" || k.Use == "sig") && (k.Alg == "" || k.Alg == Algorithm)
}

// fetchJWKS GETs and parses the JWKS at url.
func fetchJWKS(ctx context.Context, client *http.Client, url string) (map[string]ed25519.PublicKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if len(data) > maxJWKSBytes {
		return nil, fmt.Errorf("GET %s: JWKS larger than %d bytes", url, maxJWKSBytes)
	}
	return ParseJWKS(data)
}

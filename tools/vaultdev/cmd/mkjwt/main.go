// Command mkjwt makes keys and signed JWTs for trying Vault's JWT auth method
// against vaultdev by hand (standard library only).
//
//	mkjwt keygen -key /tmp/jwt.key [-alg ES256|EdDSA] > /tmp/jwt.pub
//	mkjwt sign -key /tmp/jwt.key -sub workload-1 -aud egressd [-iss URL] [-ttl 5m] [-claim k=v]...
//
// keygen writes the private key (PKCS#8 PEM) to -key and prints the public key
// (PKIX PEM) for Vault's jwt_validation_pubkeys. sign prints a compact JWS
// with iat, nbf and exp set, signed ES256 or EdDSA depending on the key.
package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "keygen":
		err = keygen(os.Args[2:])
	case "sign":
		err = sign(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkjwt: %v\n", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: mkjwt keygen -key PATH [-alg ES256|EdDSA]  |  mkjwt sign -key PATH [-iss S] [-sub S] [-aud S] [-ttl D] [-claim k=v]...")
	os.Exit(2)
}

func keygen(args []string) error {
	fs := flag.NewFlagSet("keygen", flag.ExitOnError)
	keyPath := fs.String("key", "", "where to write the private key (PKCS#8 PEM)")
	alg := fs.String("alg", "ES256", "ES256 or EdDSA")
	_ = fs.Parse(args)
	if *keyPath == "" {
		return errors.New("keygen: -key is required")
	}
	var priv crypto.Signer
	var err error
	switch *alg {
	case "ES256":
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "EdDSA":
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	default:
		return fmt.Errorf("keygen: unsupported -alg %q", *alg)
	}
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		return err
	}
	return pem.Encode(os.Stdout, &pem.Block{Type: "PUBLIC KEY", Bytes: pub})
}

type claimsFlag map[string]any

func (c claimsFlag) String() string { return "" }
func (c claimsFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("claim %q: want key=value", s)
	}
	c[k] = v
	return nil
}

func sign(args []string) error {
	fs := flag.NewFlagSet("sign", flag.ExitOnError)
	keyPath := fs.String("key", "", "private key from keygen")
	iss := fs.String("iss", "", "issuer (iss); omitted when empty")
	sub := fs.String("sub", "workload", "subject (sub)")
	aud := fs.String("aud", "egressd", "audience (aud); omitted when empty")
	ttl := fs.Duration("ttl", 5*time.Minute, "lifetime (exp - iat)")
	extra := claimsFlag{}
	fs.Var(extra, "claim", "extra string claim key=value (repeatable)")
	_ = fs.Parse(args)
	if *keyPath == "" {
		return errors.New("sign: -key is required")
	}
	pemBytes, err := os.ReadFile(*keyPath)
	if err != nil {
		return err
	}
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return fmt.Errorf("sign: %s: no PEM block", *keyPath)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return fmt.Errorf("sign: %s: %w", *keyPath, err)
	}

	now := time.Now()
	claims := map[string]any{"sub": *sub, "iat": now.Unix(), "nbf": now.Add(-5 * time.Second).Unix(), "exp": now.Add(*ttl).Unix()}
	if *iss != "" {
		claims["iss"] = *iss
	}
	if *aud != "" {
		claims["aud"] = *aud
	}
	for key, v := range extra {
		claims[key] = v
	}

	var alg string
	switch k.(type) {
	case *ecdsa.PrivateKey:
		alg = "ES256"
	case ed25519.PrivateKey:
		alg = "EdDSA"
	default:
		return fmt.Errorf("sign: unsupported key type %T", k)
	}
	enc := base64.RawURLEncoding
	h, _ := json.Marshal(map[string]string{"alg": alg, "typ": "JWT"})
	p, err := json.Marshal(claims)
	if err != nil {
		return err
	}
	input := enc.EncodeToString(h) + "." + enc.EncodeToString(p)

	var sig []byte
	switch key := k.(type) {
	case *ecdsa.PrivateKey:
		sum := sha256.Sum256([]byte(input))
		r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
		if err != nil {
			return err
		}
		sig = make([]byte, 64) // JWS ES256: R || S, each 32 bytes big-endian
		r.FillBytes(sig[:32])
		s.FillBytes(sig[32:])
	case ed25519.PrivateKey:
		sig = ed25519.Sign(key, []byte(input))
	}
	fmt.Println(input + "." + enc.EncodeToString(sig))
	return nil
}

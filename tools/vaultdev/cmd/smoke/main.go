// Command smoke checks a running vaultdev server through
// github.com/hashicorp/vault/api, the client egressd uses:
//
//	eval "$(scripts/vaultdev.sh start)"
//	(cd tools/vaultdev && go run ./cmd/smoke)
//	scripts/vaultdev.sh stop
//
// It needs VAULT_ADDR and VAULT_TOKEN (root). With EGRESSD_VAULTDEV_READY_FILE
// (exported by start; the server's ready line with its unseal key) it also
// seals and unseals Vault. It prints one line per check and exits 1 if any
// failed.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/vault/api"
)

var failed bool

func check(name string, f func() error) {
	t0 := time.Now()
	if err := f(); err != nil {
		failed = true
		fmt.Printf("FAIL %-34s %v\n", name, err)
		return
	}
	fmt.Printf("ok   %-34s (%s)\n", name, time.Since(t0).Round(time.Millisecond))
}

func main() {
	ctx := context.Background()
	root, err := api.NewClient(api.DefaultConfig())
	if err != nil || os.Getenv("VAULT_TOKEN") == "" {
		fmt.Fprintln(os.Stderr, "smoke: set VAULT_ADDR and VAULT_TOKEN (eval \"$(scripts/vaultdev.sh start)\")", err)
		os.Exit(2)
	}
	kv := root.KVv2("secret")
	const credPath = "egressd/credentials/x"

	check("kv v2 write v1, v2 + read", func() error {
		if _, err := kv.Put(ctx, credPath, map[string]any{"value": "one"}); err != nil {
			return err
		}
		if _, err := kv.Put(ctx, credPath, map[string]any{"value": "two"}); err != nil {
			return err
		}
		s, err := kv.Get(ctx, credPath)
		if err != nil {
			return err
		}
		if s.Data["value"] != "two" || s.VersionMetadata.Version < 2 {
			return fmt.Errorf("got %v version %d", s.Data, s.VersionMetadata.Version)
		}
		old, err := kv.GetVersion(ctx, credPath, s.VersionMetadata.Version-1)
		if err != nil || old.Data["value"] != "one" {
			return fmt.Errorf("previous version: %v %v", old, err)
		}
		return nil
	})

	check("policy egressd", func() error {
		return root.Sys().PutPolicyWithContext(ctx, "egressd", `
path "secret/data/egressd/*" { capabilities = ["read"] }
path "identity/oidc/token/*" { capabilities = ["read"] }`)
	})

	var approleToken string
	check("approle role + login", func() error {
		if _, err := root.Logical().WriteWithContext(ctx, "auth/approle/role/egressd", map[string]any{
			"token_policies": "egressd", "token_ttl": "3s", "token_max_ttl": "1m",
		}); err != nil {
			return err
		}
		rid, err := root.Logical().ReadWithContext(ctx, "auth/approle/role/egressd/role-id")
		if err != nil {
			return err
		}
		sid, err := root.Logical().WriteWithContext(ctx, "auth/approle/role/egressd/secret-id", nil)
		if err != nil {
			return err
		}
		c, _ := root.Clone()
		c.ClearToken()
		s, err := c.Logical().WriteWithContext(ctx, "auth/approle/login", map[string]any{
			"role_id": rid.Data["role_id"], "secret_id": sid.Data["secret_id"],
		})
		if err != nil {
			return err
		}
		approleToken = s.Auth.ClientToken
		c.SetToken(approleToken)
		got, err := c.KVv2("secret").Get(ctx, credPath)
		if err != nil || got.Data["value"] != "two" {
			return fmt.Errorf("read with approle token: %v %v", got, err)
		}
		return nil
	})

	check("LifetimeWatcher renews a 3s token", func() error {
		c, _ := root.Clone()
		c.SetToken(approleToken)
		self, err := c.Auth().Token().LookupSelfWithContext(ctx)
		if err != nil {
			return err
		}
		ttl, _ := self.TokenTTL()
		w, err := c.NewLifetimeWatcher(&api.LifetimeWatcherInput{Secret: &api.Secret{Auth: &api.SecretAuth{
			ClientToken: approleToken, Renewable: true, LeaseDuration: int(ttl.Seconds()),
		}}})
		if err != nil {
			return err
		}
		go w.Start()
		defer w.Stop()
		renewals := 0
		deadline := time.After(8 * time.Second) // well past the 3s TTL
		for {
			select {
			case err := <-w.DoneCh():
				return fmt.Errorf("watcher done early: %v", err)
			case <-w.RenewCh():
				renewals++
			case <-deadline:
				if renewals < 2 {
					return fmt.Errorf("only %d renewals", renewals)
				}
				if _, err := c.KVv2("secret").Get(ctx, credPath); err != nil {
					return fmt.Errorf("token unusable after renewals: %v", err)
				}
				return nil
			}
		}
	})

	check("unrenewed 3s token expires", func() error {
		c, _ := root.Clone()
		c.SetToken(approleToken)
		time.Sleep(4 * time.Second)
		if _, err := c.KVv2("secret").Get(ctx, credPath); err == nil {
			return errors.New("token still valid")
		}
		return nil
	})

	var jwtToken string
	check("jwt config (pubkey) + role + login", func() error {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
		if _, err := root.Logical().WriteWithContext(ctx, "auth/jwt/config", map[string]any{
			"jwt_validation_pubkeys": []string{string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))},
			"bound_issuer":           "https://issuer.test",
		}); err != nil {
			return err
		}
		if _, err := root.Logical().WriteWithContext(ctx, "auth/jwt/role/egressd", map[string]any{
			"role_type": "jwt", "bound_audiences": "egressd", "user_claim": "sub",
			"bound_subject": "workload-1", "token_policies": "egressd", "token_ttl": "1m",
		}); err != nil {
			return err
		}
		c, _ := root.Clone()
		c.ClearToken()
		s, err := c.Logical().WriteWithContext(ctx, "auth/jwt/login", map[string]any{
			"role": "egressd", "jwt": signES256(key, "https://issuer.test", "workload-1", "egressd"),
		})
		if err != nil {
			return err
		}
		jwtToken = s.Auth.ClientToken
		if _, err := c.Logical().WriteWithContext(ctx, "auth/jwt/login", map[string]any{
			"role": "egressd", "jwt": signES256(key, "https://issuer.test", "someone-else", "egressd"),
		}); err == nil {
			return errors.New("login with the wrong subject succeeded")
		}
		return nil
	})

	check("identity/oidc/token/<role>", func() error {
		if _, err := root.Logical().WriteWithContext(ctx, "identity/oidc/key/egressd", map[string]any{
			"allowed_client_ids": "*", "algorithm": "ES256",
		}); err != nil {
			return err
		}
		if _, err := root.Logical().WriteWithContext(ctx, "identity/oidc/role/upstream", map[string]any{
			"key": "egressd", "ttl": "2m",
		}); err != nil {
			return err
		}
		c, _ := root.Clone()
		c.SetToken(jwtToken) // needs a token with an entity; root has none
		s, err := c.Logical().ReadWithContext(ctx, "identity/oidc/token/upstream")
		if err != nil {
			return err
		}
		tok, _ := s.Data["token"].(string)
		if strings.Count(tok, ".") != 2 {
			return fmt.Errorf("no JWT in %v", s.Data)
		}
		v, err := root.Logical().WriteWithContext(ctx, "identity/oidc/introspect", map[string]any{"token": tok})
		if err != nil || v.Data["active"] != true {
			return fmt.Errorf("introspect: %v %v", v, err)
		}
		return nil
	})

	if b, err := os.ReadFile(os.Getenv("EGRESSD_VAULTDEV_READY_FILE")); err == nil {
		var r struct {
			UnsealKey string `json:"unseal_key"`
		}
		_ = json.Unmarshal(b, &r)
		check("seal (503) and unseal, data kept", func() error {
			if err := root.Sys().SealWithContext(ctx); err != nil {
				return err
			}
			_, err := kv.Get(ctx, credPath)
			var re *api.ResponseError
			if !errors.As(err, &re) || re.StatusCode != 503 {
				return fmt.Errorf("sealed read: want 503, got %v", err)
			}
			if _, err := root.Sys().UnsealWithContext(ctx, r.UnsealKey); err != nil {
				return err
			}
			for i := 0; ; i++ {
				s, err := kv.Get(ctx, credPath)
				if err == nil {
					if s.Data["value"] != "two" {
						return fmt.Errorf("after unseal: %v", s.Data)
					}
					return nil
				}
				if i > 100 {
					return fmt.Errorf("after unseal: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}

	if failed {
		os.Exit(1)
	}
}

func signES256(key *ecdsa.PrivateKey, iss, sub, aud string) string {
	enc := base64.RawURLEncoding
	now := time.Now().Unix()
	h, _ := json.Marshal(map[string]string{"alg": "ES256", "typ": "JWT"})
	p, _ := json.Marshal(map[string]any{"iss": iss, "sub": sub, "aud": aud, "iat": now, "nbf": now - 5, "exp": now + 300})
	in := enc.EncodeToString(h) + "." + enc.EncodeToString(p)
	sum := sha256.Sum256([]byte(in))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		panic(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return in + "." + enc.EncodeToString(sig)
}

package vault

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/hashicorp/vault/api/auth/kubernetes"

	"github.com/egressd/egressd/internal/config"
)

// AuthMethod logs egressd in to Vault (STYLE habit 18, api.AuthMethod). Login is given a
// client without a token and returns the login response: a secret whose Auth holds the
// client token, its TTL and whether it is renewable. Methods read their material (token,
// role ID, secret ID, JWT files) at every Login, so that a rotated file is used at the
// next login; they never put that material in an error.
type AuthMethod interface {
	api.AuthMethod
	Name() string // "token", "approle", "jwt", "kubernetes": for logs and errors
}

// changer is implemented by methods whose token is given rather than obtained (a token
// file): renewing past the token's max TTL, or logging in again, cannot help; the session
// polls Changed and logs in again when the token changes.
type changer interface {
	Changed() bool
}

// maxSecretFile bounds a token, role ID, secret ID or JWT file.
const maxSecretFile = 64 << 10

// readSecretFile returns the trimmed content of a file holding a secret. Its errors name
// the file and what it holds, never content.
func readSecretFile(path, what string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("%s: %w", what, err)
	case len(b) > maxSecretFile:
		return "", fmt.Errorf("%s %s: larger than %d bytes", what, path, maxSecretFile)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s %s: empty", what, path)
	}
	return s, nil
}

// loginWrite writes data to auth/<mount>/login with a token-less client; the values of data
// are scrubbed from errors.
func loginWrite(ctx context.Context, c *api.Client, mount string, data map[string]any) (*api.Secret, error) {
	path := "auth/" + mount + "/login"
	sec, err := c.Logical().WriteWithContext(ctx, path, data)
	if err != nil {
		var sent []string
		for _, v := range data {
			if s, ok := v.(string); ok {
				sent = append(sent, s)
			}
		}
		return nil, describe("PUT", path, err, sent...)
	}
	return sec, nil
}

// TokenAuth uses a token given to egressd: from a file (re-read at every login and polled
// for changes), the config's token, or VAULT_TOKEN, in that order. "Login" looks the token
// up, to learn its TTL and whether it is renewable.
type TokenAuth struct {
	token string // config token: a secret; see Format
	file  string

	mu   sync.Mutex
	last [sha256.Size]byte // of the token last logged in with
}

// NewTokenAuth returns the token method; file wins over token, and VAULT_TOKEN is used
// when both are empty.
func NewTokenAuth(token, file string) *TokenAuth { return &TokenAuth{token: token, file: file} }

// Name is "token".
func (a *TokenAuth) Name() string { return config.AuthToken }

// Format prints the method and the token file, never the token, in every verb.
func (a *TokenAuth) Format(f fmt.State, _ rune) {
	src := "VAULT_TOKEN"
	switch {
	case a.file != "":
		src = "token_file " + a.file
	case a.token != "":
		src = "token [redacted]"
	}
	fmt.Fprintf(f, "vault token auth (%s)", src)
}

func (a *TokenAuth) read() (string, error) {
	switch {
	case a.file != "":
		return readSecretFile(a.file, "token_file")
	case a.token != "":
		return a.token, nil
	}
	if t := strings.TrimSpace(os.Getenv(api.EnvVaultToken)); t != "" {
		return t, nil
	}
	return "", errors.New("no token: set token_file, token or VAULT_TOKEN")
}

// Login looks the token up with itself (auth/token/lookup-self).
func (a *TokenAuth) Login(ctx context.Context, c *api.Client) (*api.Secret, error) {
	tok, err := a.read()
	if err != nil {
		return nil, err
	}
	c.SetToken(tok)
	sec, err := c.Auth().Token().LookupSelfWithContext(ctx)
	if err != nil {
		return nil, describe("GET", "auth/token/lookup-self", err, tok)
	}
	if sec == nil {
		return nil, errors.New("token lookup: empty response")
	}
	ttl, _ := sec.TokenTTL()
	renewable, _ := sec.TokenIsRenewable()
	accessor, _ := sec.TokenAccessor()
	a.mu.Lock()
	a.last = sha256.Sum256([]byte(tok))
	a.mu.Unlock()
	return &api.Secret{Auth: &api.SecretAuth{
		ClientToken: tok, Accessor: accessor, Renewable: renewable, LeaseDuration: int(ttl / time.Second),
	}}, nil
}

// Changed reports whether the token file now holds another token than the one last
// logged in with. A token given inline or by VAULT_TOKEN never changes.
func (a *TokenAuth) Changed() bool {
	if a.file == "" {
		return false
	}
	tok, err := a.read()
	if err != nil {
		return false // the next login reports it
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return sha256.Sum256([]byte(tok)) != a.last
}

// AppRoleAuth logs in with a role ID and a secret ID, each read from its file at every
// login (auth/<mount>/login).
type AppRoleAuth struct{ mount, roleIDFile, secretIDFile string }

// NewAppRoleAuth returns the approle method; mount "" is "approle".
func NewAppRoleAuth(mount, roleIDFile, secretIDFile string) *AppRoleAuth {
	return &AppRoleAuth{mount: or(mount, config.AuthAppRole), roleIDFile: roleIDFile, secretIDFile: secretIDFile}
}

// Name is "approle".
func (a *AppRoleAuth) Name() string { return config.AuthAppRole }

// Login reads both files and logs in.
func (a *AppRoleAuth) Login(ctx context.Context, c *api.Client) (*api.Secret, error) {
	roleID, err := readSecretFile(a.roleIDFile, "role_id_file")
	if err != nil {
		return nil, err
	}
	secretID, err := readSecretFile(a.secretIDFile, "secret_id_file")
	if err != nil {
		return nil, err
	}
	return loginWrite(ctx, c, a.mount, map[string]any{"role_id": roleID, "secret_id": secretID})
}

// JWTAuth logs in with a workload identity token (a projected service-account token, a
// SPIFFE JWT-SVID ...) read from its file at every login, through Vault's JWT auth.
type JWTAuth struct{ mount, role, file string }

// NewJWTAuth returns the jwt method; mount "" is "jwt".
func NewJWTAuth(mount, role, jwtFile string) *JWTAuth {
	return &JWTAuth{mount: or(mount, config.AuthJWT), role: role, file: jwtFile}
}

// Name is "jwt".
func (a *JWTAuth) Name() string { return config.AuthJWT }

// Login reads the JWT and logs in.
func (a *JWTAuth) Login(ctx context.Context, c *api.Client) (*api.Secret, error) {
	jwt, err := readSecretFile(a.file, "jwt_file")
	if err != nil {
		return nil, err
	}
	return loginWrite(ctx, c, a.mount, map[string]any{"role": a.role, "jwt": jwt})
}

// KubernetesAuth logs in with the pod's service-account token through Vault's Kubernetes
// auth (api/auth/kubernetes). The token file is read at every login: projected tokens
// rotate.
type KubernetesAuth struct{ mount, role, file string }

// NewKubernetesAuth returns the kubernetes method; mount "" is "kubernetes", jwtFile ""
// the service-account token (config.DefaultKubernetesJWTFile).
func NewKubernetesAuth(mount, role, jwtFile string) *KubernetesAuth {
	return &KubernetesAuth{mount: or(mount, config.AuthKubernetes), role: role, file: or(jwtFile, config.DefaultKubernetesJWTFile)}
}

// Name is "kubernetes".
func (a *KubernetesAuth) Name() string { return config.AuthKubernetes }

// Login reads the service-account token and logs in.
func (a *KubernetesAuth) Login(ctx context.Context, c *api.Client) (*api.Secret, error) {
	jwt, err := readSecretFile(a.file, "jwt_file")
	if err != nil {
		return nil, err
	}
	k, err := kubernetes.NewKubernetesAuth(a.role, kubernetes.WithMountPath(a.mount), kubernetes.WithServiceAccountToken(jwt))
	if err != nil {
		return nil, err // names the missing role only
	}
	sec, err := k.Login(ctx, c)
	if err != nil {
		return nil, describe("PUT", "auth/"+a.mount+"/login", err, jwt)
	}
	return sec, nil
}

// AuthFromConfig returns the method credentials.vault.auth describes (validated by config).
func AuthFromConfig(a config.VaultAuth) (AuthMethod, error) {
	switch a.Method {
	case config.AuthToken, "":
		return NewTokenAuth(a.Token, a.TokenFile), nil
	case config.AuthAppRole:
		return NewAppRoleAuth(a.Mount, a.RoleIDFile, a.SecretIDFile), nil
	case config.AuthJWT:
		return NewJWTAuth(a.Mount, a.Role, a.JWTFile), nil
	case config.AuthKubernetes:
		return NewKubernetesAuth(a.Mount, a.Role, a.JWTFile), nil
	}
	return nil, fmt.Errorf("vault auth method %q is not supported", a.Method)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

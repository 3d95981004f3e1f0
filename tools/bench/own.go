package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/vaultdev"
)

// Paths through an egressd of their own (pathSpec.own): vault (the credential
// path's entry, the token from a Vault dev server), placeholder (a JSON body's
// environment_variable placeholder replaced) and aws (a GET signed again with
// SigV4). Only a policy file carries an env section, so the last two cannot share
// the first egressd; the vault one is started just before its runs so that it
// idles during no other path.

// ownSetup is what a path's own egressd runs on: its config and files, or why
// the path is skipped; stop ends what the setup started, after the egressd.
type ownSetup struct {
	cfg   *egressdtest.Config
	files map[string]string
	skip  string
	stop  func()
}

// measureOwn starts p's own egressd, reads the sandbox's variables from its GET
// /v1/sandbox/env, and measures p through it.
func measureOwn(ctx context.Context, env pathEnv, p pathSpec) ([]pathResult, error) {
	s, err := p.own(ctx, env)
	if s.stop != nil {
		defer s.stop()
	}
	if err != nil || s.skip != "" {
		return []pathResult{{Path: p.name, Description: p.desc, Skipped: s.skip}}, err
	}
	e, err := startEgressd(ctx, env.o.egressd, filepath.Join(env.dir, p.name), s.cfg, s.files)
	if err != nil {
		return nil, fmt.Errorf("its egressd: %w", err)
	}
	defer e.stop()
	if env.w, err = env.w.through(e, e.proxyURL); err != nil {
		return nil, err
	}
	env.e = e
	if err := e.AdminJSON("/v1/sandbox/env", http.StatusOK, &env.w.vars); err != nil {
		return nil, err
	}
	r, err := measurePath(ctx, env, p)
	if msg := e.stop(); msg != "" {
		r.Problems = append(r.Problems, "its egressd did not exit cleanly: "+msg)
	}
	return []pathResult{r}, err
}

// The vault path's Vault: scripts/vaultdev.sh's binary; the root token is also
// egressd's, since the bench measures the request path, not the login.
const (
	vaultdevScript    = "scripts/vaultdev.sh" // from the repository root, where make bench runs
	buildTimeout      = 15 * time.Minute      // a cold build takes minutes
	vaultStartTimeout = 60 * time.Second
	// vaultRefresh is short so that egressd's background reads (never on the
	// request path) fall inside every measured window.
	vaultRefresh  = 2 * time.Second
	vaultKVPrefix = "egressd/credentials" // egressd's default kv_prefix
)

// vaultSetup starts a Vault dev server holding the vault path's token.
func vaultSetup(ctx context.Context, env pathEnv) (ownSetup, error) {
	if _, err := os.Stat(vaultdevScript); err != nil {
		return ownSetup{skip: "no " + vaultdevScript + " in the working directory (run from the repository root)"}, nil
	}
	fmt.Fprintf(env.stderr, "bench: vault path: %s build (cached: instant; a cold build takes about 5 minutes; leave vault out of -paths to skip it)\n", vaultdevScript)
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	bin, err := vaultdev.Build(bctx, vaultdevScript)
	if err != nil {
		return ownSetup{skip: "build failed: " + lastLine(err.Error())}, nil
	}
	vdir := filepath.Join(env.dir, "vault-server")
	if err := os.MkdirAll(vdir, 0o700); err != nil {
		return ownSetup{}, err
	}
	sctx, cancel := context.WithTimeout(ctx, vaultStartTimeout)
	defer cancel()
	srv, err := vaultdev.Start(sctx, bin, vdir, "warn")
	if err != nil {
		return ownSetup{}, err
	}
	s := ownSetup{stop: srv.Stop}
	s.cfg, s.files = benchConfig(env.w.up, env.dns.Addr, vaultCredentials(srv.Addr, "vault-token"), benchMaxConnections)
	s.files["vault-token"] = srv.RootToken + "\n"
	c, err := srv.Client()
	if err == nil {
		_, err = c.KVv2("secret").Put(ctx, vaultKVPrefix+"/"+credentialID, map[string]any{"token": vaultCredentialToken})
	}
	return s, err
}

// vaultCredentials is the credentials section of the vault path's egressd.
func vaultCredentials(addr, tokenFile string) *egressdtest.Credentials {
	return &egressdtest.Credentials{Backend: "vault", Vault: &egressdtest.Vault{
		Address: addr, Auth: egressdtest.VaultAuth{Method: "token", TokenFile: tokenFile},
		KVMount: "secret", KVPrefix: vaultKVPrefix, Refresh: vaultRefresh.String(),
	}}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return truncate(s, 300)
}

// The placeholder path: the upstream answers 422 unless the body holds the
// value once and no placeholder.
const (
	placeholderRow        = "placeholder"
	placeholderHost       = "ph." + benchZone
	placeholderPath       = "/placeholder"
	placeholderCredential = "bench-env"
	placeholderEnvName    = "BENCH_API_KEY"
	placeholderValue      = "bench-env-value-not-a-secret-0123456789abcdef"
	placeholderPrefix     = "egressd_ph_" // internal/placeholder's
	placeholderBodySize   = 1024
)

// placeholderBody is the JSON body the sandbox sends: secret (the placeholder,
// or the value for the direct run) in a field, padded to placeholderBodySize.
func placeholderBody(secret string) []byte {
	head := `{"model":"bench","api_key":"` + secret + `","input":"`
	const tail = `"}`
	return []byte(head + strings.Repeat("a", max(0, placeholderBodySize-len(head)-len(tail))) + tail)
}

// placeholderTarget is the path's POST with secret in its body.
func placeholderTarget(w *world, secret string) target {
	return target{url: strings.TrimSuffix(w.hostURL(placeholderHost), "/") + placeholderPath, method: http.MethodPost,
		body: placeholderBody(secret)}
}

// servePlaceholder answers a placeholder-path POST: 200 and the usual body
// when it holds the value once and no placeholder, 422 otherwise.
func servePlaceholder(w http.ResponseWriter, r *http.Request, body []byte) {
	got, err := io.ReadAll(io.LimitReader(r.Body, 4*placeholderBodySize))
	if err != nil || bytes.Count(got, []byte(placeholderValue)) != 1 || bytes.Contains(got, []byte(placeholderPrefix)) {
		http.Error(w, "the body lacks the value or carries a placeholder", http.StatusUnprocessableEntity)
		return
	}
	w.Header()["Content-Length"] = []string{strconv.Itoa(len(body))}
	_, _ = w.Write(body)
}

// placeholderConfig is baseConfig but for the policy file (one entry and the
// env section) and the environment_variable credential.
func placeholderConfig(up *upstream, dnsAddr string) (*egressdtest.Config, map[string]string) {
	return ownConfig(up, dnsAddr, "environment.json", fmt.Sprintf(`{"network": {"allowlist": [{"domain": %q, "ports": [%d]}]},
 "env": {%q: {"credential": %q}}}
`, placeholderHost, portNum(up.tlsAddr), placeholderEnvName, placeholderCredential),
		fmt.Sprintf(`{%q: {"type": "environment_variable", "value": %q, "injection_location": "body", "trusted_domains": [%q]}}
`, placeholderCredential, placeholderValue, placeholderHost))
}

// ownConfig is baseConfig with a policy file and a credentials file.
func ownConfig(up *upstream, dnsAddr, policyFile, policy, creds string) (*egressdtest.Config, map[string]string) {
	cfg := baseConfig(dnsAddr)
	cfg.Policy.File = policyFile
	return cfg, map[string]string{upstreamCAFile: string(up.caPEM), policyFile: policy, credentialsFile: creds}
}

// The aws path: the upstream signs each GET again under the real keys, as S3
// would, and answers 403 unless the signature is the same.
const (
	awsRow        = "aws"
	awsHost       = "aws." + benchZone
	awsPath       = "/bench-bucket/object"
	awsCredential = "bench-aws"
	awsKeyID      = "AKIABENCHREALKEY0001"
	awsSecret     = "bench-real-secret-key-not-a-secret-000000"
	awsRegion     = "us-east-1"
	emptySHA256   = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
)

// awsTarget is the path's GET signed with the key pair.
func awsTarget(w *world, keyID, secret string) target {
	url := strings.TrimSuffix(w.hostURL(awsHost), "/") + awsPath
	return target{url: url, header: awsSigned(url, keyID, secret)}
}

// awsSigned is the header of a GET of url signed with the key pair now: the
// upstream does not bound X-Amz-Date, so one signature serves every request.
func awsSigned(url, keyID, secret string) http.Header {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("X-Amz-Content-Sha256", emptySHA256)
	_ = v4.NewSigner().SignHTTP(context.Background(), aws.Credentials{AccessKeyID: keyID, SecretAccessKey: secret},
		req, emptySHA256, "s3", awsRegion, time.Now(), func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	return req.Header
}

// awsVerified reports whether r is signed with the real keys: signed again from its
// SignedHeaders at its X-Amz-Date, the Authorization is the same.
func awsVerified(r *http.Request) bool {
	got := r.Header.Get("Authorization")
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil || !strings.Contains(got, "Credential="+awsKeyID+"/") {
		return false
	}
	_, signed, _ := strings.Cut(got, "SignedHeaders=")
	signed, _, _ = strings.Cut(signed, ",")
	check, _ := http.NewRequest(r.Method, "https://"+r.Host+r.URL.RequestURI(), nil)
	for _, name := range strings.Split(signed, ";") {
		if name != "host" {
			check.Header[http.CanonicalHeaderKey(name)] = r.Header.Values(name)
		}
	}
	err = v4.NewSigner().SignHTTP(r.Context(), aws.Credentials{AccessKeyID: awsKeyID, SecretAccessKey: awsSecret},
		check, r.Header.Get("X-Amz-Content-Sha256"), "s3", awsRegion, at, func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	return err == nil && check.Header.Get("Authorization") == got
}

// awsConfig is baseConfig but for the policy file (the aws entry and the env
// pair) and the aws credential.
func awsConfig(up *upstream, dnsAddr string) (*egressdtest.Config, map[string]string) {
	return ownConfig(up, dnsAddr, "aws.json", fmt.Sprintf(`{"network": {"allowlist": [{"domain": %q, "ports": [%d], "credential": %q, "aws": {"regions": [%q], "services": ["s3"]}}]},
 "env": {"AWS_ACCESS_KEY_ID": {"credential": %[3]q}, "AWS_SECRET_ACCESS_KEY": {"credential": %[3]q}}}
`, awsHost, portNum(up.tlsAddr), awsCredential, awsRegion),
		fmt.Sprintf(`{%q: {"type": "aws", "access_key_id": %q, "secret_access_key": %q}}
`, awsCredential, awsKeyID, awsSecret))
}

// ownConfigSetup makes a pathSpec.own of a config function.
func ownConfigSetup(config func(*upstream, string) (*egressdtest.Config, map[string]string)) func(context.Context, pathEnv) (ownSetup, error) {
	return func(_ context.Context, env pathEnv) (ownSetup, error) {
		cfg, files := config(env.w.up, env.dns.Addr)
		return ownSetup{cfg: cfg, files: files}, nil
	}
}

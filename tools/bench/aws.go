package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// The aws path: a GET signed (SigV4) with an aws credential's placeholder key pair,
// which egressd signs again with the real keys. Like the placeholder path it has an
// egressd of its own (a policy file names the pair in its env section). The
// upstream checks the signature under the real keys as S3 would, 403 otherwise.
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

func awsPathSpec() pathSpec {
	return pathSpec{
		name:    awsRow,
		desc:    "GET https://" + awsHost + ":<port>" + awsPath + " signed (SigV4, s3) with an aws credential's placeholder pair, keep-alive; through an egressd of its own (policy file with env), intercepted, signed again with the real keys, which the upstream verifies; direct: signed with the real keys",
		inject:  injectNone,
		measure: measureAWS,
	}
}

// measureAWS runs the rounds of direct and through-egressd GETs.
func measureAWS(ctx context.Context, env pathEnv) ([]pathResult, error) {
	cfg, files := awsConfig(env.w.up, env.dns.Addr)
	injects := "Authorization, X-Amz-Date (aws credential " + awsCredential + ", signed again)"
	return measureOwn(ctx, env, awsPathSpec(), injects, cfg, files, func(pe *egressd, vars map[string]string, roots *x509.CertPool) (target, target, error) {
		up := env.w.up
		url := strings.TrimSuffix(env.w.hostURL(awsHost), "/") + awsPath
		return target{url: url, dialAddr: up.tlsAddr, roots: up.roots, header: awsSigned(url, awsKeyID, awsSecret)},
			target{url: url, proxy: pe.proxyURL, roots: roots, header: awsSigned(url, vars["AWS_ACCESS_KEY_ID"], vars["AWS_SECRET_ACCESS_KEY"])}, nil
	})
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
	cfg := baseConfig(dnsAddr)
	cfg.Policy.File = "aws.json"
	return cfg, map[string]string{
		upstreamCAFile: string(up.caPEM),
		cfg.Policy.File: fmt.Sprintf(`{"network": {"allowlist": [{"domain": %q, "ports": [%d], "credential": %q, "aws": {"regions": [%q], "services": ["s3"]}}]},
 "env": {"AWS_ACCESS_KEY_ID": {"credential": %[3]q}, "AWS_SECRET_ACCESS_KEY": {"credential": %[3]q}}}
`, awsHost, portNum(up.tlsAddr), awsCredential, awsRegion),
		credentialsFile: fmt.Sprintf(`{%q: {"type": "aws", "access_key_id": %q, "secret_access_key": %q}}
`, awsCredential, awsKeyID, awsSecret),
	}
}

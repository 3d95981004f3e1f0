package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// The placeholder path: a POST whose JSON body carries an environment_variable
// credential's placeholder, which egressd replaces with the value. Only a
// policy file carries the env section, so the path has an egressd of its own;
// the placeholder comes from its GET /v1/sandbox/env. The upstream answers 422
// unless the body holds the value and no placeholder.
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

func placeholderPathSpec() pathSpec {
	return pathSpec{
		name:    placeholderRow,
		desc:    fmt.Sprintf("POST of a %d-byte JSON body carrying an environment_variable credential's placeholder to https://%s:<port>%s, keep-alive; through an egressd of its own (policy file with env), intercepted, the placeholder replaced in the body; direct: the same body with the value", placeholderBodySize, placeholderHost, placeholderPath),
		inject:  injectNone,
		measure: measurePlaceholder,
	}
}

// placeholderBody is the JSON body the sandbox sends: secret (the placeholder,
// or the value for the direct run) in a field, padded to placeholderBodySize.
func placeholderBody(secret string) []byte {
	head := `{"model":"bench","api_key":"` + secret + `","input":"`
	const tail = `"}`
	pad := max(0, placeholderBodySize-len(head)-len(tail))
	return []byte(head + strings.Repeat("a", pad) + tail)
}

// placeholderCheck is the upstream's check of one request body: the value
// once, and no placeholder.
func placeholderCheck(body []byte) bool {
	return bytes.Count(body, []byte(placeholderValue)) == 1 && !bytes.Contains(body, []byte(placeholderPrefix))
}

// servePlaceholder answers a placeholder-path POST: 200 and the usual body
// when placeholderCheck passes, 422 otherwise.
func servePlaceholder(w http.ResponseWriter, r *http.Request, body []byte) {
	got, err := io.ReadAll(io.LimitReader(r.Body, 4*placeholderBodySize))
	if err != nil || !placeholderCheck(got) {
		http.Error(w, "the body lacks the value or carries a placeholder", http.StatusUnprocessableEntity)
		return
	}
	w.Header()["Content-Length"] = []string{strconv.Itoa(len(body))}
	_, _ = w.Write(body)
}

// measurePlaceholder runs the rounds of direct and through-egressd POSTs.
func measurePlaceholder(ctx context.Context, env pathEnv) ([]pathResult, error) {
	cfg, files := placeholderConfig(env.w.up, env.dns.Addr)
	injects := "the value of " + placeholderCredential + " in place of its placeholder (body)"
	return measureOwn(ctx, env, placeholderPathSpec(), injects, cfg, files, func(pe *egressd, vars map[string]string, roots *x509.CertPool) (target, target, error) {
		ph := vars[placeholderEnvName]
		if !strings.HasPrefix(ph, placeholderPrefix) {
			return target{}, target{}, fmt.Errorf("/v1/sandbox/env gave %s %q, not a placeholder", placeholderEnvName, ph)
		}
		up := env.w.up
		url := strings.TrimSuffix(env.w.hostURL(placeholderHost), "/") + placeholderPath
		return target{url: url, dialAddr: up.tlsAddr, roots: up.roots, method: http.MethodPost, body: placeholderBody(placeholderValue), check: drain},
			target{url: url, proxy: pe.proxyURL, roots: roots, method: http.MethodPost, body: placeholderBody(ph), check: drain}, nil
	})
}

// measureOwn starts the path's egressd of its own (cfg and files: a policy file
// with an env section), reads the sandbox's variables from its GET
// /v1/sandbox/env, and runs the rounds of the direct and through-egressd targets
// made from them.
func measureOwn(ctx context.Context, env pathEnv, spec pathSpec, injects string, cfg *egressdtest.Config, files map[string]string,
	targets func(pe *egressd, vars map[string]string, roots *x509.CertPool) (direct, via target, err error)) ([]pathResult, error) {
	pe, err := startEgressd(ctx, env.o.egressd, filepath.Join(env.dir, spec.name), cfg, files)
	if err != nil {
		return nil, fmt.Errorf("%s egressd: %w", spec.name, err)
	}
	defer pe.stop()
	b, err := pe.adminGet("/v1/sandbox/env")
	var vars map[string]string
	if err == nil {
		err = json.Unmarshal(b, &vars)
	}
	if err != nil {
		return nil, fmt.Errorf("/v1/sandbox/env: %w", err)
	}
	roots, err := pe.CAPool()
	if err != nil {
		return nil, err
	}
	direct, via, err := targets(pe, vars, roots)
	if err != nil {
		return nil, err
	}
	up, lo := env.w.up, env.o.load()
	rb := newRow(spec.name, spec.desc, injects)
	err = runRounds(env, pe, func(int) (runResult, error) { return runCounted(ctx, direct, lo, up, nil) },
		[]leg{{row: rb, run: func(cpu cpuFunc) (runResult, error) { return runCounted(ctx, via, lo, up, cpu) }}}, nil)
	if err != nil {
		return nil, err
	}
	return []pathResult{rb.finish(pe)}, nil
}

// placeholderConfig is baseConfig but for the policy file (one entry and the
// env section) and the environment_variable credential.
func placeholderConfig(up *upstream, dnsAddr string) (*egressdtest.Config, map[string]string) {
	cfg := baseConfig(dnsAddr)
	cfg.Policy.File = "environment.json"
	return cfg, map[string]string{
		upstreamCAFile: string(up.caPEM),
		cfg.Policy.File: fmt.Sprintf(`{"network": {"allowlist": [{"domain": %q, "ports": [%d]}]},
 "env": {%q: {"credential": %q}}}
`, placeholderHost, portNum(up.tlsAddr), placeholderEnvName, placeholderCredential),
		credentialsFile: fmt.Sprintf(`{%q: {"type": "environment_variable", "value": %q, "injection_location": "body", "trusted_domains": [%q]}}
`, placeholderCredential, placeholderValue, placeholderHost),
	}
}

package main

import (
	"bytes"
	"context"
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

// measurePlaceholder starts the path's egressd, reads the placeholder and runs
// the rounds of direct and through-egressd POSTs.
func measurePlaceholder(ctx context.Context, env pathEnv) ([]pathResult, error) {
	cfg, files := placeholderConfig(env.w.up, env.dns.Addr)
	pe, err := startEgressd(ctx, env.o.egressd, filepath.Join(env.dir, placeholderRow), cfg, files)
	if err != nil {
		return nil, fmt.Errorf("%s egressd: %w", placeholderRow, err)
	}
	defer pe.stop()
	ph, err := sandboxPlaceholder(pe)
	if err != nil {
		return nil, err
	}
	roots, err := pe.CAPool()
	if err != nil {
		return nil, err
	}
	up, lo := env.w.up, env.o.load()
	url := strings.TrimSuffix(env.w.hostURL(placeholderHost), "/") + placeholderPath
	direct := target{url: url, dialAddr: up.tlsAddr, roots: up.roots, method: http.MethodPost, body: placeholderBody(placeholderValue), check: drain}
	via := target{url: url, proxy: pe.proxyURL, roots: roots, method: http.MethodPost, body: placeholderBody(ph), check: drain}
	rb := newRow(placeholderRow, placeholderPathSpec().desc, "the value of "+placeholderCredential+" in place of its placeholder (body)")
	err = runRounds(env, pe, func(int) (runResult, error) { return runCounted(ctx, direct, lo, up, nil) },
		[]leg{{row: rb, run: func(cpu cpuFunc) (runResult, error) { return runCounted(ctx, via, lo, up, cpu) }}}, nil)
	if err != nil {
		return nil, err
	}
	return []pathResult{rb.finish(pe)}, nil
}

// sandboxPlaceholder reads placeholderEnvName's placeholder from egressd's
// GET /v1/sandbox/env, what the sandbox's environment gets.
func sandboxPlaceholder(e *egressd) (string, error) {
	b, err := e.adminGet("/v1/sandbox/env")
	if err != nil {
		return "", fmt.Errorf("/v1/sandbox/env: %w", err)
	}
	var envs map[string]string
	if err := json.Unmarshal(b, &envs); err != nil {
		return "", fmt.Errorf("/v1/sandbox/env: %w", err)
	}
	ph := envs[placeholderEnvName]
	if !strings.HasPrefix(ph, placeholderPrefix) {
		return "", fmt.Errorf("/v1/sandbox/env gave %s %q, not a placeholder", placeholderEnvName, ph)
	}
	return ph, nil
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

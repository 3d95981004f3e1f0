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
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// The placeholder path (issue 15): a POST whose JSON body carries the
// placeholder of an environment_variable credential, which egressd replaces
// with the value on the way to the upstream. Only a policy file carries the
// `env` section that names the placeholder, so the path runs through an egressd
// of its own (in <tmp>/placeholder/) whose policy is placeholderPolicy and
// whose credentials.json holds the credential. The sandbox's placeholder comes
// from that egressd's GET /v1/sandbox/env. The upstream answers 200 only when
// the body holds the value and no placeholder (422 otherwise: a client error).
const (
	placeholderRow        = "placeholder"
	placeholderHost       = "ph." + benchZone
	placeholderPath       = "/placeholder"
	placeholderCredential = "bench-env"
	placeholderEnvName    = "BENCH_API_KEY"
	// placeholderValue is the fake secret egressd puts in place of the placeholder.
	placeholderValue = "bench-env-value-not-a-secret-0123456789abcdef"
	// placeholderPrefix begins every placeholder (internal/placeholder).
	placeholderPrefix = "egressd_ph_"
	// placeholderBodySize is the JSON body's size as the sandbox sends it.
	placeholderBodySize = 1024
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
// or the value for the direct run) in a field, padded to placeholderBodySize
// with the placeholder.
func placeholderBody(secret string) []byte {
	head := `{"model":"bench","api_key":"` + secret + `","input":"`
	const tail = `"}`
	pad := placeholderBodySize - len(head) - len(tail)
	if pad < 0 {
		pad = 0
	}
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
// o.rounds pairs of direct and through-egressd POSTs.
func measurePlaceholder(ctx context.Context, env pathEnv) ([]pathResult, error) {
	pe, err := startPlaceholderEgressd(ctx, env)
	if err != nil {
		return nil, err
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
	w, o := env.w, env.o
	url := w.hostURL(placeholderHost)
	url = strings.TrimSuffix(url, "/") + placeholderPath
	drain := func(resp *http.Response) error { _, err := io.Copy(io.Discard, resp.Body); return err }
	direct := customTarget{target: target{url: url, dialAddr: w.up.tlsAddr, roots: w.up.roots},
		method: http.MethodPost, body: placeholderBody(placeholderValue), check: drain}
	via := customTarget{target: target{url: url, proxy: pe.proxyURL, roots: roots},
		method: http.MethodPost, body: placeholderBody(ph), check: drain}
	lo := loadOptions{clients: o.clients, size: o.size, warmup: o.warmup, duration: o.duration}
	rb := &rowBuilder{res: pathResult{Path: placeholderRow, Description: placeholderPathSpec().desc,
		Injects: "the value of " + placeholderCredential + " in place of its placeholder (body)"}}
	for range o.rounds {
		d, err := upstreamRun(w.up, func() (runResult, error) { return runCustomLoad(ctx, direct, lo, nil) })
		if err != nil {
			return nil, fmt.Errorf("direct: %w", err)
		}
		x, err := measureVia(pe, env.dns, func(cpu func() (time.Duration, error)) (runResult, error) {
			return upstreamRun(w.up, func() (runResult, error) { return runCustomLoad(ctx, via, lo, cpu) })
		})
		if err != nil {
			return nil, fmt.Errorf("through egressd: %w", err)
		}
		rb.add(d, x)
	}
	return []pathResult{rb.finish(pe)}, nil
}

// upstreamRun runs load and fills its far-side figures from the upstream's counters.
func upstreamRun(u *upstream, load func() (runResult, error)) (runResult, error) {
	conns, served := u.srv.Conns(), u.served.Load()
	r, err := load()
	r.UpstreamConns, r.UpstreamRequests = u.srv.Conns()-conns, u.served.Load()-served
	return r, err
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

// startPlaceholderEgressd starts the path's egressd in <tmp>/placeholder.
func startPlaceholderEgressd(ctx context.Context, env pathEnv) (*egressd, error) {
	cfg, files := placeholderConfig(env.w.up, env.dns.Addr)
	e, err := startEgressd(ctx, env.o.egressd, filepath.Join(env.dir, placeholderRow), cfg, files)
	if err != nil {
		return nil, fmt.Errorf("%s egressd: %w", placeholderRow, err)
	}
	return e, nil
}

// placeholderConfig is baseConfig but for the policy, a file (environment.json:
// one entry and the env section, which only a policy file carries), and the
// credentials file (the environment_variable credential).
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

// writePlaceholderNote compares the placeholder row's CPU per request with the
// credential row's, when both ran.
func (r *report) writePlaceholderNote(w io.Writer) {
	p, c := r.path(placeholderRow), r.path("credential")
	if p == nil || c == nil || p.CPUPerReqUS <= 0 || c.CPUPerReqUS <= 0 {
		return
	}
	fmt.Fprintf(w, "placeholder / credential: CPU %+.1f µs/req (%.1f vs %.1f), egressd req/s %.2f (a %d-byte JSON body's placeholder replaced vs an injected Authorization on a GET)\n",
		p.CPUPerReqUS-c.CPUPerReqUS, p.CPUPerReqUS, c.CPUPerReqUS, p.Egressd.ReqPerSec/c.Egressd.ReqPerSec, placeholderBodySize)
}

package egressdtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// adminTimeout bounds one request to the admin listener.
const adminTimeout = 15 * time.Second

// adminClient talks to the admin listener directly, never through a proxy.
var adminClient = &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: adminTimeout}

// unixClient talks to the admin listener on the Unix socket at path.
func unixClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: dialUnix(path), DisableKeepAlives: true}, Timeout: adminTimeout}
}

// dialUnix dials the Unix socket at path whatever address it is asked for.
func dialUnix(path string) func(ctx context.Context, _, _ string) (net.Conn, error) {
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
}

// healthPaths are served by the health listener when there is one.
var healthPaths = []string{"/healthz", "/readyz", "/metrics"}

// adminTarget is the client and URL for path on the listener that serves it: the
// health listener's for health paths when admin.health_address is set, else the
// admin listener's (a Unix socket's when its address is unix://PATH).
func (e *Egressd) adminTarget(path string) (*http.Client, string, error) {
	addr := e.Admin
	if h := e.Addrs["health"]; h != "" && slices.ContainsFunc(healthPaths, func(p string) bool { return strings.HasPrefix(path, p) }) {
		addr = h
	}
	if addr == "" {
		return nil, "", errors.New("egressd has no admin listener")
	}
	if sock, ok := strings.CutPrefix(addr, "unix://"); ok {
		return unixClient(sock), "http://egressd-admin" + path, nil
	}
	return adminClient, "http://" + addr + path, nil
}

// AdminGet fetches path from the admin listener: the status and the body.
func (e *Egressd) AdminGet(path string) (int, []byte, error) {
	return e.admin(http.MethodGet, path)
}

// AdminPost posts an empty JSON body to path (such as /v1/reload).
func (e *Egressd) AdminPost(path string) (int, []byte, error) {
	return e.admin(http.MethodPost, path)
}

func (e *Egressd) admin(method, path string) (int, []byte, error) {
	client, u, err := e.adminTarget(path)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		return 0, nil, err
	}
	if e.opts.AdminToken != "" {
		req.Header.Set("Authorization", "Bearer "+e.opts.AdminToken)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, b, err
}

// AdminJSON fetches path, which must answer wantCode, and decodes its body into v.
func (e *Egressd) AdminJSON(path string, wantCode int, v any) error {
	code, body, err := e.AdminGet(path)
	switch {
	case err != nil:
		return err
	case code != wantCode:
		return fmt.Errorf("GET %s: %d, want %d: %s", path, code, wantCode, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: not JSON: %v: %s", path, err, body)
	}
	return nil
}

// Health is the part of /healthz the suites read.
type Health struct {
	Status     string `json:"status"`
	ConfigHash string `json:"config_hash"`
}

// Healthz reads /healthz, which must answer 200.
func (e *Egressd) Healthz() (Health, error) {
	var h Health
	err := e.AdminJSON("/healthz", http.StatusOK, &h)
	return h, err
}

// Readyz reads /readyz: whether egressd is ready, and the whole body.
func (e *Egressd) Readyz() (bool, map[string]any, error) {
	code, body, err := e.AdminGet("/readyz")
	if err != nil {
		return false, nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		return false, nil, fmt.Errorf("/readyz (%d): not JSON: %s", code, body)
	}
	ready, _ := m["ready"].(bool)
	return ready && code == http.StatusOK, m, nil
}

// Metrics scrapes /metrics into series -> value, each series written as
// Prometheus writes it (labels in name order), such as
// `egressd_config_reloads_total{result="ok"}`.
func (e *Egressd) Metrics() (map[string]float64, error) {
	code, b, err := e.AdminGet("/metrics")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /metrics: %d", code)
	}
	if err != nil {
		return nil, err
	}
	return ParseMetrics(b)
}

// Metric is one series' value from /metrics, and whether it is exported.
func (e *Egressd) Metric(series string) (float64, bool, error) {
	m, err := e.Metrics()
	v, ok := m[series]
	return v, ok, err
}

// ParseMetrics reads the Prometheus text format: series -> value (a trailing
// timestamp is ignored).
func ParseMetrics(b []byte) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		series, rest := splitSeries(line)
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("/metrics: no value: %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("/metrics: %q: %v", line, err)
		}
		out[series] = v
	}
	return out, sc.Err()
}

// splitSeries cuts a sample line after its series: the name and, when present,
// the labels up to their closing brace (label values may hold spaces).
func splitSeries(line string) (string, string) {
	if i := strings.IndexByte(line, '{'); i >= 0 && i < strings.IndexByte(line+" ", ' ') {
		if j := strings.LastIndex(line, "} "); j > i {
			return line[:j+1], line[j+1:]
		}
	}
	name, rest, _ := strings.Cut(line, " ")
	return name, rest
}

// CAPEM is egressd's interception CA, as GET /ca.pem serves it.
func (e *Egressd) CAPEM() ([]byte, error) {
	code, b, err := e.AdminGet("/ca.pem")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /ca.pem: %d", code)
	}
	return b, err
}

// CAPool is a pool holding egressd's interception CA: what clients of an
// intercepted tunnel trust.
func (e *Egressd) CAPool() (*x509.CertPool, error) {
	b, err := e.CAPEM()
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("GET /ca.pem holds no certificate")
	}
	return pool, nil
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Bounds on egressd's lifecycle, so a broken build cannot hang the bench.
const (
	// startTimeout bounds the wait for both listeners and /healthz.
	startTimeout = 10 * time.Second
	// stopTimeout bounds the wait after SIGTERM before SIGKILL. Every client
	// connection is closed by then, so egressd's drain has nothing to wait for.
	stopTimeout = 10 * time.Second
	// logSettle bounds the wait for egressd to finish writing the lines of a
	// run (tunnels log when they close, just after the run ends).
	logSettle = 3 * time.Second
	// maxExamples is how many raw unexpected log lines a report keeps per path.
	maxExamples = 5
)

// egressd is the subprocess under test, with the config and log it runs with.
type egressd struct {
	*child
	dir       string
	logPath   string // egressd's stdout: its JSON log, one line per request
	errPath   string // its stderr: load errors before the logger exists
	proxyURL  string // http://127.0.0.1:port of the bench listener
	adminAddr string
}

// startEgressd writes the config into dir, starts egressd on it and returns once
// /healthz answers. Listeners bind port 0; their addresses come from the
// "listening" log lines, so no port is ever guessed. creds is the config's
// credentials section; "" means the file backend (fileCredentials). maxConns
// is limits.max_connections (benchMaxConnections but for the hook-attack row).
func startEgressd(ctx context.Context, bin, dir string, up *upstream, dnsAddr, creds string, maxConns int) (*egressd, error) {
	cfgPath, err := writeConfig(dir, up, dnsAddr, creds, maxConns)
	if err != nil {
		return nil, err
	}
	return launchEgressd(ctx, bin, dir, cfgPath)
}

// launchEgressd starts egressd on cfgPath in dir and returns once /healthz answers.
func launchEgressd(ctx context.Context, bin, dir, cfgPath string) (*egressd, error) {
	e := &egressd{
		dir:     dir,
		logPath: filepath.Join(dir, "egressd.log"),
		errPath: filepath.Join(dir, "egressd.stderr"),
	}
	if err := e.spawn(bin, cfgPath); err != nil {
		return nil, err
	}
	if err := e.waitReady(ctx); err != nil {
		e.stop()
		return nil, fmt.Errorf("%w%s", err, e.stderrTail())
	}
	return e, nil
}

func (e *egressd) spawn(bin, cfgPath string) error {
	cmd := exec.Command(bin, "run", "--config", cfgPath)
	cmd.Dir = e.dir
	c, err := startChild(cmd, e.logPath, e.errPath)
	e.child = c
	return err
}

// waitReady waits for the bench and admin listeners to be bound and for
// /healthz to answer 200.
func (e *egressd) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for e.proxyURL == "" || e.adminAddr == "" {
		if err := e.pause(ctx, "listening"); err != nil {
			return err
		}
		addrs, err := listening(e.logPath)
		if err != nil {
			return err
		}
		if a := addrs["bench"]; a != "" {
			e.proxyURL = "http://" + a
		}
		e.adminAddr = addrs["admin"]
	}
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: time.Second}
	defer hc.CloseIdleConnections()
	for {
		resp, err := hc.Get("http://" + e.adminAddr + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if err := e.pause(ctx, "/healthz"); err != nil {
			return err
		}
	}
}

// listening reads the "listening" lines egressd logs at start: listener name
// to bound address.
func listening(logPath string) (map[string]string, error) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return nil, err
	}
	addrs := map[string]string{}
	for line := range bytes.Lines(data) {
		var l struct{ Message, Listener, Address string }
		if json.Unmarshal(line, &l) == nil && l.Message == "listening" {
			addrs[l.Listener] = l.Address
		}
	}
	return addrs, nil
}

func (e *egressd) stderrTail() string {
	b, _ := os.ReadFile(e.errPath)
	if log, _ := os.ReadFile(e.logPath); len(log) > 0 {
		b = append(b, log...)
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	if len(b) == 0 {
		return ""
	}
	return "; egressd said:\n" + string(b)
}

// adminTimeout bounds one request to egressd's admin listener.
const adminTimeout = 5 * time.Second

// adminGet fetches path from egressd's admin listener (a loopback literal).
func (e *egressd) adminGet(path string) ([]byte, error) {
	if err := loopbackOnly(e.adminAddr); err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: adminTimeout}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + e.adminAddr + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", path, resp.StatusCode)
	}
	return b, nil
}

// caPool is egressd's interception CA, which it generated into state_dir on
// start: what clients of intercepted tunnels trust.
func (e *egressd) caPool() (*x509.CertPool, error) {
	path := filepath.Join(e.dir, stateDir, caCertName)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("egressd's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("egressd's CA: %s holds no PEM certificate", path)
	}
	return pool, nil
}

// Where egressd generates its CA: state_dir in configTemplate, and the file
// name egressd uses there (internal/tls CACertName).
const (
	stateDir   = "state"
	caCertName = "ca.pem"
)

// leafCounts is egressd_leaf_cache_total by result.
type leafCounts struct {
	Hit  int64 `json:"hit"`
	Miss int64 `json:"miss"`
}

func (c leafCounts) sub(o leafCounts) leafCounts { return leafCounts{c.Hit - o.Hit, c.Miss - o.Miss} }

// leafCache scrapes egressd_leaf_cache_total from /metrics.
func (e *egressd) leafCache() (leafCounts, error) {
	b, err := e.adminGet("/metrics")
	if err != nil {
		return leafCounts{}, err
	}
	return parseLeafCache(b)
}

// parseLeafCache reads egressd_leaf_cache_total{result="hit"|"miss"} from the
// Prometheus text format.
func parseLeafCache(metrics []byte) (leafCounts, error) {
	var c leafCounts
	found := 0
	for line := range strings.Lines(string(metrics)) {
		rest, ok := strings.CutPrefix(line, "egressd_leaf_cache_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		f := strings.Fields(value) // the value, then an optional timestamp
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return c, fmt.Errorf("egressd_leaf_cache_total: %w", err)
		}
		switch {
		case strings.Contains(labels, `result="hit"`):
			c.Hit, found = int64(v), found+1
		case strings.Contains(labels, `result="miss"`):
			c.Miss, found = int64(v), found+1
		}
	}
	if found == 0 {
		return c, errors.New("no egressd_leaf_cache_total in /metrics")
	}
	return c, nil
}

// peakRSS is VmHWM, the resident set's high-water mark over the whole run.
func (e *egressd) peakRSS() (int64, string) {
	n, err := procPeakRSS(e.cmd.Process.Pid)
	if err != nil {
		return 0, err.Error()
	}
	return n, ""
}

func (e *egressd) logSize() int64 {
	fi, err := os.Stat(e.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logSummary is what egressd logged during one run through it: the canonical
// line count, and every line that was not a plain success, grouped.
type logSummary struct {
	Lines       int64            `json:"lines"`
	EgressLines int64            `json:"egress_lines"` // one per request or tunnel
	Allowed200  int64            `json:"allowed_200"`  // egress lines: decision allow, status 200, no error
	Scrubbed    int64            `json:"scrubbed"`     // egress lines whose response egressd scrubbed (scrubbed > 0)
	Unexpected  map[string]int64 `json:"unexpected,omitempty"`
	Examples    []string         `json:"examples,omitempty"` // raw lines, the first few
}

// merge adds o, a later run's summary, to s.
func (s *logSummary) merge(o logSummary) {
	s.Lines += o.Lines
	s.EgressLines += o.EgressLines
	s.Allowed200 += o.Allowed200
	s.Scrubbed += o.Scrubbed
	for k, n := range o.Unexpected {
		if s.Unexpected == nil {
			s.Unexpected = map[string]int64{}
		}
		s.Unexpected[k] += n
	}
	for _, ex := range o.Examples {
		if len(s.Examples) < maxExamples {
			s.Examples = append(s.Examples, ex)
		}
	}
}

// scanLog summarises the log from offset from, once egressd has stopped
// writing (tunnels log at close, which is just after a run ends).
func (e *egressd) scanLog(from int64) (logSummary, error) {
	e.settleLog()
	var s logSummary
	f, err := os.Open(e.logPath)
	if err != nil {
		return s, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return s, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		s.add(sc.Bytes())
	}
	return s, sc.Err()
}

// settleLog waits, up to logSettle, for the log to stop growing.
func (e *egressd) settleLog() {
	deadline := time.Now().Add(logSettle)
	last, stable := e.logSize(), 0
	for stable < 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n := e.logSize()
		if n == last {
			stable++
		} else {
			last, stable = n, 0
		}
	}
}

var (
	egressMsg = []byte(`"message":"egress"`)
	scrubbed  = []byte(`"scrubbed":`)
	unmasked  = []byte(`"scrubbed":0,`)
	allowed   = []byte(`"decision":"allow"`)
	status200 = []byte(`"status":200,`)
	noError   = []byte(`"error":""`)
)

func (s *logSummary) add(line []byte) {
	s.Lines++
	isEgress := bytes.Contains(line, egressMsg)
	if isEgress {
		s.EgressLines++
		if bytes.Contains(line, scrubbed) && !bytes.Contains(line, unmasked) {
			s.Scrubbed++
		}
		// The fast path: most lines are successes and are not decoded.
		if bytes.Contains(line, allowed) && bytes.Contains(line, status200) && bytes.Contains(line, noError) {
			s.Allowed200++
			return
		}
	}
	key, ok := unexpectedKey(line, isEgress)
	if !ok {
		return
	}
	if s.Unexpected == nil {
		s.Unexpected = map[string]int64{}
	}
	s.Unexpected[key]++
	if len(s.Examples) < maxExamples {
		s.Examples = append(s.Examples, truncate(string(line), 600))
	}
}

// reflectedWarn begins the WARN egressd logs the first time an upstream reflects
// an injected value (internal/proxy/scrub.go).
const reflectedWarn = "an upstream reflected a value egressd injected"

// unexpectedKey groups an egress line that is not a plain success, or a
// warn/error line; other lines (info, debug) are not unexpected.
func unexpectedKey(line []byte, isEgress bool) (string, bool) {
	var l struct {
		Level, Message, Method, Scheme, Decision, Reason, Detail, Error string
		Status                                                          int
	}
	if err := json.Unmarshal(line, &l); err != nil {
		return "unparsed line: " + truncate(string(line), 120), true
	}
	if isEgress {
		k := fmt.Sprintf("%s %s: decision=%s status=%d", l.Method, l.Scheme, l.Decision, l.Status)
		if l.Reason != "" {
			k += " reason=" + l.Reason
		}
		if l.Detail != "" {
			k += " detail=" + l.Detail
		}
		if l.Error != "" {
			k += " error=" + normalizeErr(l.Error)
		}
		return k, true
	}
	if l.Level == "warn" && strings.HasPrefix(l.Message, reflectedWarn) {
		return "", false // the credential paths' upstream reflects on purpose
	}
	if l.Level == "warn" || l.Level == "error" || l.Level == "fatal" || l.Level == "panic" {
		return l.Level + ": " + l.Message + errSuffix(l.Error), true
	}
	return "", false
}

func errSuffix(err string) string {
	if err == "" {
		return ""
	}
	return ": " + normalizeErr(err)
}

// ephemeral matches loopback addresses with a port, which differ on every
// connection and would split one kind of error into thousands of groups.
var ephemeral = regexp.MustCompile(`127\.\d+\.\d+\.\d+:\d+`)

func normalizeErr(s string) string {
	return ephemeral.ReplaceAllString(s, "127.x:port")
}

func truncate(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// writeConfig writes egressd.yaml (and the files it names) into dir and
// returns its path. Every address it names is on 127.0.0.0/8: the upstream,
// the DNS stub (dnsAddr), egressd's own listeners and, with the vault
// backend, Vault. creds is the credentials section; "" means the file backend:
// fileCredentials, and a credentials.json beside the config.
func writeConfig(dir string, up *upstream, dnsAddr, creds string, maxConns int) (string, error) {
	caPath := filepath.Join(dir, "bench-ca.pem")
	if err := os.WriteFile(caPath, up.caPEM, 0o600); err != nil {
		return "", err
	}
	oauthEntry := "" // the oauth2 path's entry: only the file-backed egressd has its credential
	if creds == "" {
		oauthEntry = "    - domain: " + oauthHost + "             # oauth2\n      ports: [{TLS_PORT}]\n      credential: " + oauthCredentialID
		creds = fileCredentials
		// The credential path's entry names credentialID; its token is a fake.
		file := fmt.Sprintf("{%q: {\"token\": %q},\n %q: {\"type\": \"oauth2\", \"client_id\": \"bench\", \"client_secret\": \"bench-secret\", \"refresh_token\": \"bench-refresh\", \"token_url\": \"https://%s:%s%s\"}}\n",
			credentialID, credentialToken, oauthCredentialID, credentialHost, tlsPortOf(up), oauthTokenPath)
		if err := os.WriteFile(filepath.Join(dir, "credentials.json"), []byte(file), 0o600); err != nil {
			return "", err
		}
	}
	httpPort, err := portOf(up.httpAddr)
	if err != nil {
		return "", err
	}
	tlsPort, err := portOf(up.tlsAddr)
	if err != nil {
		return "", err
	}
	hookEntry, hooks, err := hookConfig(dir, up) // "" unless the hook path runs
	if err != nil {
		return "", err
	}
	cfg := strings.NewReplacer(
		"{OAUTH_ENTRY}", strings.ReplaceAll(oauthEntry, "{TLS_PORT}", tlsPort),
		"{HTTP_PORT}", httpPort,
		"{TLS_PORT}", tlsPort,
		"{TRANSFORM_HOST}", transformHost,
		"{TRANSFORM_HEADER}", transformHeader,
		"{TRANSFORM_VALUE}", transformValue,
		"{CREDENTIAL_HOST}", credentialHost,
		"{CREDENTIAL_ID}", credentialID,
		"{RESOLVER}", dnsAddr,
		"{UPSTREAM_CA}", strconv.Quote(caPath),
		"{STATE_DIR}", stateDir,
		"{CREDENTIALS}", strings.TrimSuffix(creds, "\n"),
		"{HOOK_ENTRY}", hookEntry,
		"{HOOKS}", hooks,
		"{MAX_CONNECTIONS}", strconv.Itoa(maxConns),
	).Replace(configTemplate)
	path := filepath.Join(dir, "egressd.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// tlsPortOf is the upstream's HTTPS port ("" when its address has none).
func tlsPortOf(up *upstream) string {
	p, _ := portOf(up.tlsAddr)
	return p
}

func portOf(addr string) (string, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", errors.New("address without a port: " + addr)
	}
	return addr[i+1:], nil
}

// fileCredentials is the credentials section of the (first) egressd: the
// credential path's token comes from credentials.json.
const fileCredentials = `credentials:
  backend: file
  file: credentials.json
`

// configHead is the start of every bench egressd's config: its environment,
// the bench listener and the admin listener, both on port 0.
const configHead = `version: 1
environment: env_bench
listeners:
  - name: bench
    address: 127.0.0.1:0
    mode: proxy
    role: sandbox
admin:
  address: 127.0.0.1:0
`

// configTemplate is egressd's config for a bench run: its full request path
// (allowlist, address guard, interception and injection where an entry asks
// for it, one JSON log line per request at info) with loopback opened, since
// the upstream lives there. Listeners bind port 0. The intercepted entries are
// names in benchZone, which only the DNS stub (network.resolver) answers;
// localhost still comes from /etc/hosts.
const configTemplate = `# Generated by egressd's bench for one run; removed with its temp dir.
` + configHead + `policy:
  allowlist:
    - domain: localhost                 # plain, connect: spliced, nothing injected
      ports: [{HTTP_PORT}, {TLS_PORT}]
    - domain: {TRANSFORM_HOST}        # intercept, intercept-newconn
      ports: [{TLS_PORT}]
      transform: {"{TRANSFORM_HEADER}": "{TRANSFORM_VALUE}"}
    - domain: {CREDENTIAL_HOST}         # credential
      ports: [{TLS_PORT}]
      credential: {CREDENTIAL_ID}
{OAUTH_ENTRY}
{HOOK_ENTRY}
network:
  resolver: {RESOLVER}       # the bench's DNS stub: answers *.bench.test only, forwards nothing
  unsafe_allow_cidrs: [127.0.0.0/8]   # the upstream is on loopback; development and tests only
tls:
  intercept: auto                     # entries with a transform or credential
  upstream_ca_file: {UPSTREAM_CA}
{CREDENTIALS}
{HOOKS}
limits:
  max_connections: {MAX_CONNECTIONS}            # per listener (default 10,000): above -idle-tunnels' most, so that path measures memory (the attack row: below its attackers)
log:
  level: info                         # the canonical line per request is part of the cost
  format: json
state_dir: {STATE_DIR}                # egressd generates its CA (ca.pem) here on first start
`

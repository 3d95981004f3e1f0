package proxy_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
)

// envValue is the environment_variable credential's value: the upstream of a trusted
// domain receives it in place of the placeholder; nothing else ever sees it.
const envValue = `sk-PLANTED "env" value&=/+`

// newPlaceholderWorld: "ev" may go to api.allowed.test in headers, the query and the
// body; "hdr" only in headers, to api.allowed.test; "rule" has no trusted_domains, so
// only hosts whose winning entry names it (www.allowed.test). other.test is allowed
// under "*" and trusted by nobody.
func newPlaceholderWorld(t *testing.T) *world { return newPlaceholderWorldLimits(t, nil) }

// newPlaceholderWorldLimits is newPlaceholderWorld with limits changed by limits.
func newPlaceholderWorldLimits(t *testing.T, limits func(*config.Limits)) *world {
	secret := func(locs, domains string) string {
		v, _ := json.Marshal(envValue)
		return `{"type": "environment_variable", "value": ` + string(v) + `, "injection_location": ` + locs + `, "trusted_domains": ` + domains + `}`
	}
	w := newWorld(t, worldOpts{
		allowlist: []allowlist.Entry{
			{Domain: "api.allowed.test"},
			{Domain: "www.allowed.test", Credential: "rule"},
			{Domain: "tx.allowed.test", Transform: []allowlist.Header{{Name: "X-Key", Value: "static-transform-value"}}},
			{Domain: "*"},
		},
		credentials: map[string]string{
			"ev":   secret(`["header", "query", "body"]`, `["api.allowed.test"]`),
			"hdr":  secret(`"header"`, `["api.allowed.test"]`),
			"rule": secret(`"header"`, `[]`),
		},
		envVars: map[string]string{"EV_KEY": "ev", "HDR_KEY": "hdr", "RULE_KEY": "rule"},
		limits:  limits,
	})
	w.DNS.Set("tx.allowed.test", "A "+w.PublicIP)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		recorded.Store(w, upstreamSeen{r.Header, r.URL, string(body), r.ContentLength, r.TransferEncoding})
		rw.Header().Set("Content-Type", "application/json")
		json.NewEncoder(rw).Encode(echoed{r.Method, r.Host, r.URL.Path, r.Proto, r.Header, string(body)})
	})
	return w
}

// recorded is each world's last upstream request.
var recorded sync.Map

func (w *world) ph(name string) string {
	p := w.Env[name]
	if !strings.HasPrefix(p, "egressd_ph_") {
		w.t.Fatalf("no placeholder for %s: %v", name, w.Env)
	}
	return p
}

// TestPlaceholderReplacedInTrustedLocations: header, Basic, query (raw and
// percent-encoded) and body (JSON, form, raw; Content-Length and chunked framing) of a
// request to the trusted domain carry the value; the response never shows it.
func TestPlaceholderReplacedInTrustedLocations(t *testing.T) {
	w := newPlaceholderWorld(t)
	ev := w.ph("EV_KEY")
	c := w.interceptingClient()
	pctEncoded := strings.ReplaceAll(url.QueryEscape(ev), "_", "%5f") // any case, any character encoded
	req, _ := http.NewRequest("POST", "https://api.allowed.test/v1?key="+ev+"&enc="+pctEncoded+"&keep=a%20b",
		strings.NewReader(`{"api_key": "`+ev+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", ev)
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:"+ev)))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	respBody, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(respBody), envValue) || strings.Contains(string(respBody), url.QueryEscape(envValue)) {
		t.Error("the response shows the value (not scrubbed)")
	}
	seen := w.lastUpstreamRequest(t)
	if got := seen.Header.Get("X-Api-Key"); got != envValue {
		t.Errorf("header: %q", got)
	}
	if got := seen.Header.Get("Authorization"); got != "Basic "+base64.StdEncoding.EncodeToString([]byte("user:"+envValue)) {
		t.Errorf("Basic: %q", got)
	}
	q := seen.URL.Query()
	if q.Get("key") != envValue || q.Get("enc") != envValue || q.Get("keep") != "a b" {
		t.Errorf("query: %q", seen.URL.RawQuery)
	}
	jv, _ := json.Marshal(map[string]string{"api_key": envValue})
	if got := seen.Body; got != `{"api_key": "`+string(jv[12:len(jv)-2])+`"}` {
		t.Errorf("JSON body: %q", got)
	}
	if seen.ContentLength != int64(len(seen.Body)) || len(seen.TransferEncoding) != 0 {
		t.Errorf("framing: Content-Length %d for %d bytes, TE %v", seen.ContentLength, len(seen.Body), seen.TransferEncoding)
	}

	// A form body, chunked: form-escaped, still chunked.
	pr, pw := io.Pipe()
	go func() { io.WriteString(pw, "a=1&key="+ev); pw.Close() }()
	req, _ = http.NewRequest("POST", "https://api.allowed.test/form", pr)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if resp, err = c.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	seen = w.lastUpstreamRequest(t)
	if seen.Body != "a=1&key="+url.QueryEscape(envValue) || !slicesEq(seen.TransferEncoding, []string{"chunked"}) {
		t.Errorf("form body %q TE %v", seen.Body, seen.TransferEncoding)
	}

	// A plain body: raw.
	req, _ = http.NewRequest("PUT", "https://api.allowed.test/raw", strings.NewReader("k="+ev+"\n"))
	if resp, err = c.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if seen = w.lastUpstreamRequest(t); seen.Body != "k="+envValue+"\n" || seen.ContentLength != int64(len(seen.Body)) {
		t.Errorf("raw body %q (Content-Length %d)", seen.Body, seen.ContentLength)
	}
	w.assertValueNotLogged()
}

// TestPlaceholderOutOfScopeIsRefused: another host, another location, or (without
// trusted_domains) a host whose entry does not name the credential: 403
// credential_scope, a WARN naming the credential and host, nothing forwarded.
func TestPlaceholderOutOfScopeIsRefused(t *testing.T) {
	w := newPlaceholderWorld(t)
	c := w.interceptingClient()
	ev, hdr, rule := w.ph("EV_KEY"), w.ph("HDR_KEY"), w.ph("RULE_KEY")
	cases := []struct {
		name, method, url, body string
		header                  string
		cred, location          string
	}{
		{"other host, header", "GET", "http://other.test/", "", ev, "ev", "header"},
		{"other host, query", "GET", "http://other.test/?k=" + url.QueryEscape(ev), "", "", "ev", "query"},
		{"other host, body", "POST", "http://other.test/", `{"k":"` + ev + `"}`, "", "ev", "body"},
		{"trusted host, location not named", "GET", "https://api.allowed.test/?k=" + hdr, "", "", "hdr", "query"},
		{"no trusted_domains, entry names another", "GET", "https://api.allowed.test/", "", rule, "rule", "header"},
		// The entry sets X-Key itself: the client's copy, placeholder and all, would be
		// removed unseen if injection ran first.
		{"other host, in a header the entry injects", "GET", "https://tx.allowed.test/", "", ev, "ev", "header"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := w.Upstream.requests.Load()
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req, _ := http.NewRequest(tc.method, tc.url, body)
			if tc.header != "" {
				req.Header.Set("X-Key", tc.header)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			assertRefused(t, resp, 403, "credential_scope", tc.location)
			if n := w.Upstream.requests.Load() - before; n != 0 {
				t.Errorf("the upstream got %d requests", n)
			}
			logs := string(w.logs.Bytes())
			if !strings.Contains(logs, `"credential":"`+tc.cred+`"`) || !strings.Contains(logs, "credential placeholder outside its scope refused") {
				t.Errorf("no WARN naming %s:\n%s", tc.cred, logs)
			}
		})
	}
	// The entry that names "rule" (no trusted_domains) gets it replaced.
	req, _ := http.NewRequest("GET", "https://www.allowed.test/", nil)
	req.Header.Set("X-Key", rule)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeEcho(t, resp); got.Header.Get("X-Key") == envValue {
		t.Error("the response shows the value (not scrubbed)")
	}
	if got := w.lastUpstreamRequest(t); got.Header.Get("X-Key") != envValue {
		t.Errorf("www.allowed.test got X-Key %q", got.Header.Get("X-Key"))
	}
	w.assertValueNotLogged()
}

// TestPlaceholderOverPlainHTTPIsRefused: a replacement into a plain-HTTP request is
// plaintext_credential (the value would cross the network in clear), nothing forwarded.
func TestPlaceholderOverPlainHTTPIsRefused(t *testing.T) {
	w := newPlaceholderWorld(t)
	req, _ := http.NewRequest("GET", "http://api.allowed.test/", nil)
	req.Header.Set("X-Key", w.ph("EV_KEY"))
	resp, err := w.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	assertRefused(t, resp, 403, "plaintext_credential", "")
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
}

// TestPlaceholderTrustedDomainIsIntercepted: under intercept auto, a CONNECT to a trusted
// domain whose entry injects nothing is intercepted, so the placeholder is replaced.
func TestPlaceholderTrustedDomainIsIntercepted(t *testing.T) {
	w := newPlaceholderWorld(t)
	req, _ := http.NewRequest("GET", "https://api.allowed.test/", nil)
	req.Header.Set("X-Key", w.ph("HDR_KEY"))
	resp, err := w.interceptingClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	decodeEcho(t, resp)
	if got := w.lastUpstreamRequest(t); got.Header.Get("X-Key") != envValue {
		t.Errorf("X-Key %q", got.Header.Get("X-Key"))
	}
	if line := w.lastLog(""); line["intercepted"] != true {
		t.Errorf("not intercepted: %v", line)
	}
}

// upstreamSeen is one request as the echo upstream received it.
type upstreamSeen struct {
	Header           http.Header
	URL              *url.URL
	Body             string
	ContentLength    int64
	TransferEncoding []string
}

// lastUpstreamRequest returns the last request the upstream received (set by record).
func (w *world) lastUpstreamRequest(t *testing.T) upstreamSeen {
	t.Helper()
	s, ok := recorded.Load(w)
	if !ok {
		t.Fatal("the upstream recorded no request")
	}
	return s.(upstreamSeen)
}

func (w *world) assertValueNotLogged() {
	w.t.Helper()
	logs := w.logs.Bytes()
	for _, v := range []string{envValue, url.QueryEscape(envValue), strconv.Quote(envValue)} {
		if bytes.Contains(logs, []byte(v)) {
			w.t.Errorf("the value appears in the log")
		}
	}
}

func slicesEq(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

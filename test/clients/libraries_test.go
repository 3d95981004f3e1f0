package clients_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// The HTTP libraries (Python requests and httpx, Node undici and fetch) each run
// once per mode with a batch of requests (testdata/python_client.py,
// testdata/node_client.cjs: one JSON line per request), each request checked in
// a subtest of its own.

// httpResult is one JSON line of a library client.
type httpResult struct {
	Status      int
	Reason      string // Python: the reason phrase
	StatusText  string // Node: the status text
	HTTPVersion string `json:"http_version"`
	Headers     map[string]string
	Body        string
	Raised      string // what raise_for_status() raised
	Error       string // the exception or error the request ended with
}

// printed is what a program using the library shows a person.
func (r httpResult) printed() string {
	return strings.TrimSpace(strings.Join([]string{r.Reason, r.StatusText, r.Raised, r.Error}, " | "))
}

func (r httpResult) header(name string) string {
	for k, v := range r.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// request is one request of a batch and its check.
type request struct {
	name   string
	method string
	url    func(path string) string
	body   map[string]string // sent as JSON
	check  func(t *testing.T, w *world, path string, r httpResult)
}

// batch runs argv with the requests (each under its own path) and checks each
// result in a subtest, tracked in the matrix as client / request.
func batch(client string, argv []string, reqs []request) func(*testing.T, *world, string) {
	return func(t *testing.T, w *world, path string) {
		type spec struct {
			Method string            `json:"method"`
			URL    string            `json:"url"`
			JSON   map[string]string `json:"json,omitempty"` // python
			Body   string            `json:"body,omitempty"` // node
		}
		var specs []spec
		for i, r := range reqs {
			s := spec{Method: r.method, URL: r.url(path + itoa(i) + "/"), JSON: r.body}
			if r.body != nil {
				b, _ := json.Marshal(r.body)
				s.Body = string(b)
			}
			specs = append(specs, s)
		}
		raw, _ := json.Marshal(specs)
		o := w.run(t, nil, argv[0], append(argv[1:], string(raw))...)
		results := jsonLines[httpResult](o.stdout)
		if len(results) != len(reqs) {
			t.Fatalf("%s printed %d results for %d requests\n%s", client, len(results), len(reqs), o)
		}
		for i, r := range reqs {
			t.Run(r.name, func(t *testing.T) {
				w.mx.track(t, client, r.name, w.mode)
				r.check(t, w, path+itoa(i)+"/", results[i])
			})
		}
	}
}

// served: a 200 from the stand-in over version ("" any), as want says.
func served(version string, want expect) func(*testing.T, *world, string, httpResult) {
	return func(t *testing.T, w *world, path string, r httpResult) {
		t.Helper()
		if r.Status != 200 || (version != "" && r.HTTPVersion != version) {
			t.Fatalf("status %d over %q, want 200 over %s; the client printed: %s", r.Status, r.HTTPVersion, or(version, "any"), r.printed())
		}
		w.assertServed(t, path, r.Body, want)
	}
}

// refused: egressd's 403 with reason, readable by the client (status, header,
// JSON body); what the client shows a person is logged, and with mustShow it
// must name the reason.
func refused(reason string, mustShow bool) func(*testing.T, *world, string, httpResult) {
	return func(t *testing.T, w *world, path string, r httpResult) {
		t.Helper()
		t.Logf("the client printed: %s", r.printed())
		if r.Status != 403 || r.header("Egressd-Reason") != reason {
			t.Fatalf("status %d, Egressd-Reason %q, want 403 %s; the client printed: %s%s", r.Status,
				r.header("Egressd-Reason"), reason, r.printed(), sinkholeNote(w.mode, r.Error))
		}
		assertRefusal(t, r.Body, reason)
		if mustShow && !strings.Contains(r.printed(), "(egressd: "+reason+")") {
			t.Errorf("what the client shows, %q, does not name %s", r.printed(), reason)
		}
		w.assertNotServed(t, path)
	}
}

// bypassed: the client ignored HTTPS_PROXY and failed on its own (no name
// resolves where the explicit-mode clients run), so nothing reached the stand-in.
func bypassed(t *testing.T, w *world, path string, r httpResult) {
	if r.Error == "" {
		t.Fatalf("status %d: the client reached something without the proxy", r.Status)
	}
	t.Logf("the client printed: %s", r.Error)
	w.assertNotServed(t, path)
}

var injectedBody = map[string]string{"model": "stand-in", "prompt": "hello"}

// libraryRequests is the batch every library sends: a spliced and an injected
// https request, a plain http one, and two refusals. h2 is the HTTP version the
// library reports on https ("" when it reports none).
func libraryRequests(https, http string, showsReason map[string]bool) []request {
	return []request{
		{name: "https spliced", method: "GET", url: httpsURL(githubHost),
			check: served(https, expect{host: githubHost, tls: true})},
		{name: "https injected POST", method: "POST", url: httpsURL(openaiHost), body: injectedBody,
			check: served(https, expect{host: openaiHost, tls: true, auth: "Bearer <OPENAI>", body: mustJSON(injectedBody)})},
		{name: "http", method: "GET", url: httpURL(plainHost),
			check: served(http, expect{host: plainHost, proto: "HTTP/1.1"})},
		{name: "refused https not_allowlisted", method: "GET", url: httpsURL(evilHost),
			check: refused("not_allowlisted", showsReason["https"])},
		{name: "refused http plaintext_credential", method: "GET", url: httpURL(openaiHost),
			check: refused("plaintext_credential", showsReason["http"])},
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func pythonCases() []clientCase {
	py := func(lib string) []string { return []string{python, script("python_client.py"), lib} }
	spliced := request{name: "https spliced", method: "GET", url: httpsURL(githubHost),
		check: served("HTTP/1.1", expect{host: githubHost, tls: true})}
	ignoring := spliced
	ignoring.name, ignoring.check = "https spliced, HTTPS_PROXY ignored", bypassed
	return []clientCase{
		// urllib's HTTPError names the reason: "HTTP Error 403: Forbidden (egressd: ...)".
		{client: "python urllib", tool: "python", run: batch("python urllib", py("urllib"),
			libraryRequests("HTTP/1.1", "HTTP/1.1", map[string]bool{"https": true, "http": true}))},
		// raise_for_status() names the reason: the reason phrase of an HTTP/1.1
		// status line is egressd's.
		{client: "python requests", tool: "python", run: batch("python requests", py("requests"),
			libraryRequests("HTTP/1.1", "HTTP/1.1", map[string]bool{"https": true, "http": true}))},
		// HTTP/2 has no reason phrase: over https only the body and the header
		// name the reason.
		{client: "python httpx h2", tool: "python", run: batch("python httpx h2", py("httpx-h2"),
			libraryRequests("HTTP/2", "HTTP/1.1", map[string]bool{"http": true}))},
		// aiohttp reads the proxy variables only with trust_env=True.
		{client: "python aiohttp", tool: "python", modes: []mode{explicit}, run: batch("python aiohttp", py("aiohttp"), []request{ignoring})},
		{client: "python aiohttp", tool: "python", modes: []mode{transparent}, run: batch("python aiohttp", py("aiohttp"), []request{spliced})},
		{client: "python aiohttp trust_env", tool: "python", run: batch("python aiohttp trust_env", py("aiohttp-trust-env"),
			libraryRequests("HTTP/1.1", "HTTP/1.1", map[string]bool{"https": true, "http": true}))},
	}
}

func nodeCases() []clientCase {
	node := func(how string) []string { return []string{"node", script("node_client.cjs"), how} }
	builtin := []request{{name: "https spliced", method: "GET", url: httpsURL(githubHost),
		check: served("", expect{host: githubHost, tls: true})}}
	ignoring := []request{{name: "https spliced, HTTPS_PROXY ignored", method: "GET", url: httpsURL(githubHost),
		check: bypassed}}
	global := []request{
		builtin[0],
		{name: "http", method: "GET", url: httpURL(plainHost), check: served("", expect{host: plainHost, proto: "HTTP/1.1"})},
	}
	return []clientCase{
		{client: "node undici", tool: "node", run: batch("node undici", node("undici"),
			libraryRequests("", "", map[string]bool{"https": true, "http": true}))},
		{client: "node fetch", tool: "node", modes: []mode{explicit}, run: batch("node fetch", node("fetch"), ignoring)},
		{client: "node fetch", tool: "node", modes: []mode{transparent}, run: batch("node fetch", node("fetch"), builtin)},
		{client: "node fetch + EnvHttpProxyAgent", tool: "node",
			run: batch("node fetch + EnvHttpProxyAgent", node("fetch-global"), global)},
	}
}

package egressdtest_test

import (
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

func TestMain(m *testing.M) {
	os.Exit(egressdtest.Main(m, egressdtest.BuildOptions{}, (*testing.M).Run))
}

// TestLifecycle: the harness starts egressd on a typed config, an allowed request
// reaches the echo with the injected header, and the harness reads the canonical
// line, the metrics, /healthz, /readyz and the CA, then stops egressd with exit 0.
func TestLifecycle(t *testing.T) {
	up := &echo.Server{}
	t.Cleanup(up.Close)
	port, err := up.Listen("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	e := egressdtest.StartT(t, egressdtest.Options{Wait: egressdtest.WaitReady, Config: &egressdtest.Config{
		Version: 1, Environment: "env_harness",
		Listeners: []egressdtest.Listener{{Name: "sandbox", Address: "127.0.0.1:0", Mode: "proxy", Role: "sandbox"}},
		Admin:     &egressdtest.Admin{Address: "127.0.0.1:0"},
		Policy: egressdtest.Policy{Allowlist: []egressdtest.Entry{{Domain: "localhost", Ports: []int{port},
			Transform: map[string]string{"X-Harness": "set"}, AllowPlaintext: true}}},
		Network:     egressdtest.Network{UnsafeAllowCIDRs: []string{"127.0.0.0/8", "::1/128"}},
		Credentials: &egressdtest.Credentials{Backend: "file", File: "credentials.json"},
		Log:         &egressdtest.Log{Level: "info", Format: "json"},
	}, Files: map[string]string{"credentials.json": "{}"}})

	got := getThrough(t, e, "http://localhost:"+strconv.Itoa(port)+"/hello")
	if got.Path != "/hello" || got.Header.Get("X-Harness") != "set" || up.Conns() != 1 {
		t.Errorf("the echo saw %+v over %d connection(s)", got, up.Conns())
	}
	line := e.WaitLineT(t, "the egress line of /hello", func(l egressdtest.Line) bool {
		return egressdtest.IsEgress("")(l) && l.Str("path") == "/hello"
	})
	if line.Str("decision") != "allow" || line.Num("status") != 200 || line.Str("req_id") == "" {
		t.Errorf("egress line %v", line)
	}
	if v := e.MetricT(t, `egressd_requests_total{decision="allow",listener="sandbox",reason=""}`); v != 1 {
		t.Errorf("allowed requests = %v, want 1", v)
	}
	if again := e.EgressLine(t, line.Str("req_id")); again.Str("path") != "/hello" {
		t.Errorf("EgressLine(%s) = %v", line.Str("req_id"), again)
	}
	assertAdmin(t, e)
	if code, err := e.Stop(); err != nil || code != 0 {
		t.Errorf("Stop: exit %d, %v", code, err)
	}
	if f := e.Faults(); len(f) > 0 {
		t.Error(f)
	}
}

func assertAdmin(t *testing.T, e *egressdtest.Egressd) {
	t.Helper()
	if h, err := e.Healthz(); err != nil || h.ConfigHash == "" {
		t.Errorf("/healthz: %+v, %v", h, err)
	}
	if ready, body, err := e.Readyz(); err != nil || !ready {
		t.Errorf("/readyz: %v %v, %v", ready, body, err)
	}
	if _, err := e.CAPool(); err != nil {
		t.Error(err)
	}
}

func getThrough(t *testing.T, e *egressdtest.Egressd, rawURL string) echo.Request {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: e.Proxy})}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s %v", resp.StatusCode, b, err)
	}
	got, err := echo.Decode(b)
	if err != nil {
		t.Fatalf("not an echo: %s", b)
	}
	return got
}

// TestCursorKeepsTheRest: a Wait that matches one line of several read at once
// leaves the rest for the next Wait.
func TestCursorKeepsTheRest(t *testing.T) {
	dir := t.TempDir()
	log := `{"message":"a","n":1}` + "\n" + `{"message":"a","n":2}` + "\n" + `{"message":"egress","req_id":"x"}` + "\n" + `{"message":"a","n":3}`
	if err := os.WriteFile(dir+"/"+egressdtest.LogName, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	e := egressdtest.Open(dir)
	c := e.Cursor(0)
	for _, want := range []float64{1, 2} {
		if l, err := c.Wait(time.Second, egressdtest.IsMessage("a")); err != nil || l.Num("n") != want {
			t.Fatalf("Wait = %v, %v; want line %v", l, err, want)
		}
	}
	if l, err := c.Wait(100*time.Millisecond, egressdtest.IsMessage("a")); err == nil {
		t.Fatalf("Wait returned the unfinished line %v", l)
	}
	if l, err := e.WaitNth(time.Second, 1, egressdtest.IsEgress("x")); err != nil || l.Str("req_id") != "x" {
		t.Fatalf("WaitNth = %v, %v", l, err)
	}
}

// TestCursorRaw: Raw returns the complete lines undecoded, a line that is not
// JSON included, holds back an unfinished last line, and moves past what it returned.
func TestCursorRaw(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/" + egressdtest.LogName
	if err := os.WriteFile(path, []byte(`{"message":"a"}`+"\nnot json\n"+`{"mess`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := egressdtest.Open(dir).Cursor(0)
	if b, err := c.Raw(); err != nil || string(b) != `{"message":"a"}`+"\nnot json\n" {
		t.Fatalf("Raw = %q, %v", b, err)
	}
	if err := os.WriteFile(path, []byte(`{"message":"a"}`+"\nnot json\n"+`{"message":"b"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := c.Raw(); err != nil || string(b) != `{"message":"b"}`+"\n" {
		t.Fatalf("Raw after the line ended = %q, %v", b, err)
	}
}

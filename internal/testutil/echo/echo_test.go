package echo_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// TestEcho: over HTTP/2 and TLS the echo answers with the redacted headers and body
// it received, records them, counts the connection, and leaves routed requests to
// their route.
func TestEcho(t *testing.T) {
	ca := testpki.New(t)
	leaf := ca.Leaf(t, "localhost")
	s := &echo.Server{
		Redact: func(v string) string { return strings.ReplaceAll(v, "s3cret", "<S>") },
		Route: func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path != "/routed" {
				return false
			}
			io.WriteString(w, "routed")
			return true
		},
	}
	t.Cleanup(s.Close)
	port, err := s.Listen("127.0.0.1:0", &leaf)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	base := "https://localhost:" + strconv.Itoa(port)
	req, _ := http.NewRequest(http.MethodPost, base+"/p", strings.NewReader("body s3cret"))
	req.Header.Set("Authorization", "Bearer s3cret")
	got := do(t, c, req)
	if got.Proto != "HTTP/2.0" || !got.TLS || got.Path != "/p" || got.Header.Get("Authorization") != "Bearer <S>" || got.Body != "body <S>" {
		t.Errorf("echo answered %+v", got)
	}
	req, _ = http.NewRequest(http.MethodGet, base+"/routed", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "routed" || s.Count() != 1 || s.Served() != 2 || s.Conns() != 1 {
		t.Errorf("routed %q; recorded %d, served %d over %d connection(s)", b, s.Count(), s.Served(), s.Conns())
	}
}

func do(t *testing.T, c *http.Client, req *http.Request) echo.Request {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	got, err := echo.Decode(b)
	if err != nil {
		t.Fatalf("not an echo: %s", b)
	}
	return got
}

package conformance_test

import (
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestExpectContinue: clients that send Expect: 100-continue and wait for the 100
// before the body (botocore's S3 uploads, .NET, git pushes; curl waits a second by
// default) get egressd's 100 once the request is allowed, on plain HTTP and inside
// an intercepted tunnel, and the upstream records the whole body. Before the
// outbound request had its own header map, removing Expect for the upstream removed
// it from the client's request too, and no 100 was ever sent.
func TestExpectContinue(t *testing.T) {
	w := newWorld(t, config{})
	for _, u := range []string{"http://allowed.test/expect", "https://api.allowed.test/expect"} {
		t.Run("Go client "+u, func(t *testing.T) {
			k := w.begin(t)
			c := k.client()
			tr := c.Transport.(*http.Transport)
			tr.ExpectContinueTimeout, tr.ForceAttemptHTTP2 = 8*time.Second, false
			req, _ := http.NewRequest("POST", u, strings.NewReader("uploaded"))
			req.Header.Set("Expect", "100-continue")
			start := time.Now()
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if took := time.Since(start); took > 4*time.Second {
				t.Errorf("POST with Expect took %v: the client waited out its timeout for a 100", took)
			}
			if got := k.assertUpstreamSaw(1)[0]; got.Body != "uploaded" || got.Header.Get("Expect") != "" {
				t.Errorf("upstream recorded body %q, Expect %q", got.Body, got.Header.Get("Expect"))
			}
		})
	}
	t.Run("curl", func(t *testing.T) {
		if _, err := exec.LookPath("curl"); err != nil {
			t.Skip("curl not installed")
		}
		k := w.begin(t)
		out, err := exec.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{time_total}", "--max-time", "20",
			"--expect100-timeout", "8", "-H", "Expect: 100-continue", "-x", "http://"+w.ProxyAddr,
			"--data-binary", "uploaded", "http://allowed.test/expect").CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v %s", err, out)
		}
		if took, _ := time.ParseDuration(strings.TrimSpace(string(out)) + "s"); took > 4*time.Second {
			t.Errorf("curl took %v: it waited out --expect100-timeout for a 100", took)
		}
		if got := k.assertUpstreamSaw(1)[0]; got.Body != "uploaded" {
			t.Errorf("upstream recorded body %q", got.Body)
		}
	})
}

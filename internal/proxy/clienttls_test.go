package proxy_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestInterceptedSessionResumes: a client that keeps a session cache resumes its
// TLS session with egressd when it reconnects through a new CONNECT tunnel, on
// TLS 1.2 and 1.3, and each request on a resumed tunnel is still decided and
// injected as on the first.
func TestInterceptedSessionResumes(t *testing.T) {
	for _, ver := range []struct {
		name string
		v    uint16
	}{{"TLS1.2", tls.VersionTLS12}, {"TLS1.3", tls.VersionTLS13}} {
		t.Run(ver.name, func(t *testing.T) {
			w := newInjectWorld(t, worldOpts{})
			cache := tls.NewLRUClientSessionCache(4)
			for i := range 3 {
				tc := tls.Client(w.connect(t, "api.allowed.test:443"), &tls.Config{ServerName: "api.allowed.test",
					RootCAs: w.CAPool, NextProtos: []string{"http/1.1"}, MaxVersion: ver.v, ClientSessionCache: cache})
				got := getOver(t, tc, "api.allowed.test")
				st := tc.ConnectionState()
				tc.Close()
				if st.DidResume != (i > 0) || st.Version != ver.v {
					t.Errorf("tunnel %d: DidResume %v version %x, want resumed from the second on", i+1, st.DidResume, st.Version)
				}
				if a := got.Header.Get("Authorization"); a != "Bearer "+secretMark {
					t.Errorf("tunnel %d: upstream Authorization %q, want the injected one", i+1, a)
				}
			}
		})
	}
}

// TestInterceptedRefusesCBCSuites: a TLS 1.2 client that offers only CBC suites
// gets no handshake with egressd (alert handshake_failure, logged as client_tls)
// and nothing reaches the upstream.
func TestInterceptedRefusesCBCSuites(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	var cbc []uint16
	for _, s := range tls.CipherSuites() {
		if strings.Contains(s.Name, "_CBC_") {
			cbc = append(cbc, s.ID)
		}
	}
	tc := tls.Client(w.connect(t, "api.allowed.test:443"), &tls.Config{ServerName: "api.allowed.test",
		RootCAs: w.CAPool, MaxVersion: tls.VersionTLS12, CipherSuites: cbc})
	defer tc.Close()
	err := tc.Handshake()
	if err == nil || !strings.Contains(err.Error(), "handshake failure") {
		t.Fatalf("handshake offering only CBC suites: %v (suite %s), want alert handshake_failure",
			err, tls.CipherSuiteName(tc.ConnectionState().CipherSuite))
	}
	l := w.waitLog(t, func(m map[string]any) bool { return m["method"] == "CONNECT" && m["detail"] == "client_tls" })
	if l["reason"] != "bad_request" {
		t.Errorf("logged reason %v, want bad_request", l["reason"])
	}
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
}

// getOver sends GET / for host on tc (handshaking first) and returns what the
// upstream echoed. Reading the response also reads a TLS 1.3 session ticket.
func getOver(t *testing.T, tc *tls.Conn, host string) echoed {
	t.Helper()
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(tc, "GET / HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	return decodeEcho(t, resp)
}

package main

import (
	"crypto/x509"
	"strings"
	"sync/atomic"
	"testing"
)

func TestLookupPaths(t *testing.T) {
	got, err := lookupPaths(" connect, plain ")
	if err != nil || len(got) != 2 || got[0].name != "connect" || got[1].name != "plain" {
		t.Errorf("lookupPaths = %v, %v", got, err)
	}
	for _, bad := range []string{"", ",", "plain,plain", "intercepted"} {
		if _, err := lookupPaths(bad); err == nil {
			t.Errorf("lookupPaths(%q) succeeded", bad)
		}
	}
}

func TestLoopbackOnly(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:80", "127.1.2.3:8080", "[::1]:443"} {
		if err := loopbackOnly(ok); err != nil {
			t.Errorf("loopbackOnly(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"localhost:80", "10.0.0.1:80", "example.com:443", "[::ffff:8.8.8.8]:53", "127.0.0.1"} {
		if loopbackOnly(bad) == nil {
			t.Errorf("loopbackOnly(%q) allowed it", bad)
		}
	}
}

func TestInterceptPaths(t *testing.T) {
	w := &world{up: &upstream{tlsAddr: "127.0.0.1:1443", roots: x509.NewCertPool()}, proxy: "http://127.0.0.1:3128", egressdRoots: x509.NewCertPool()}
	ps, err := lookupPaths("intercept,intercept-newconn,intercept-resume,credential")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		d, v := p.direct(w), p.viaProxy(w)
		if d.url != v.url || !strings.HasSuffix(d.url, ".bench.test:1443/") || d.dialAddr != "127.0.0.1:1443" || v.proxy != w.proxy {
			t.Errorf("%s: direct %+v, via %+v", p.name, d, v)
		}
		if d.newConnPerRequest != strings.HasPrefix(p.name, "intercept-") || v.newConnPerRequest != d.newConnPerRequest {
			t.Errorf("%s: newConnPerRequest %v/%v", p.name, d.newConnPerRequest, v.newConnPerRequest)
		}
		if d.resumeSessions != (p.name == "intercept-resume") || v.resumeSessions != d.resumeSessions {
			t.Errorf("%s: resumeSessions %v/%v", p.name, d.resumeSessions, v.resumeSessions)
		}
		tr, err := newTransport(v, new(atomic.Int64))
		if err != nil {
			t.Fatal(err)
		}
		if (tr.TLSClientConfig.ClientSessionCache != nil) != v.resumeSessions {
			t.Errorf("%s: session cache %v, want one only when resuming", p.name, tr.TLSClientConfig.ClientSessionCache)
		}
	}
}

func TestInjectionProblems(t *testing.T) {
	p := pathSpec{name: "intercept", inject: injectTransform}
	ok := runResult{UpstreamRequests: 10, Injected: map[string]int64{injectTransform.name: 10}}
	if got := injectionProblems(p.inject, 0, 1, runResult{UpstreamRequests: 10}, ok); len(got) != 0 {
		t.Errorf("all injected: %v", got)
	}
	for _, tc := range []struct {
		name        string
		p           pathSpec
		direct, via runResult
	}{
		{"one missing", p, runResult{UpstreamRequests: 10}, runResult{UpstreamRequests: 10, Injected: map[string]int64{injectTransform.name: 9}}},
		{"nothing through egressd", p, runResult{}, runResult{}},
		{"direct carries it", p, runResult{UpstreamRequests: 10, Injected: map[string]int64{injectTransform.name: 1}}, ok},
		{"other header", p, runResult{}, runResult{UpstreamRequests: 10, Injected: map[string]int64{injectTransform.name: 10, injectCredential.name: 1}}},
		{"uninjected path", pathSpec{name: "connect"}, runResult{}, runResult{UpstreamRequests: 10, Injected: map[string]int64{injectTransform.name: 1}}},
	} {
		if got := injectionProblems(tc.p.inject, 0, 1, tc.direct, tc.via); len(got) == 0 {
			t.Errorf("%s: no problem found", tc.name)
		}
	}
}

func TestVaultPath(t *testing.T) {
	ps, err := lookupPaths("vault")
	if err != nil || len(ps) != 1 || ps[0].own == nil || ps[0].inject != injectVaultCredential {
		t.Fatalf("lookupPaths(vault) = %+v, %v", ps, err)
	}
	w := &world{up: &upstream{tlsAddr: "127.0.0.1:1443"}, proxy: "http://127.0.0.1:3128"}
	if d, v := ps[0].direct(w), ps[0].viaProxy(w); d.url != "https://"+credentialHost+":1443/" || v.url != d.url || v.proxy != w.proxy {
		t.Errorf("vault: direct %+v, via %+v; want the credential path's host", d, v)
	}
	ok := runResult{UpstreamRequests: 10, Injected: map[string]int64{injectVaultCredential.name: 10}}
	if got := injectionProblems(ps[0].inject, 0, 1, runResult{UpstreamRequests: 10}, ok); len(got) != 0 {
		t.Errorf("all from Vault: %v", got)
	}
	// The file's token on the vault path means the second egressd did not read Vault.
	if got := injectionProblems(ps[0].inject, 0, 1, runResult{}, runResult{UpstreamRequests: 10, Injected: map[string]int64{injectCredential.name: 10}}); len(got) == 0 {
		t.Error("the file-backed token on the vault path: no problem found")
	}
	cred, _ := lookupPaths("credential")
	if got := injectionProblems(cred[0].inject, 0, 1, runResult{}, runResult{UpstreamRequests: 10, Injected: map[string]int64{injectCredential.name: 10, injectVaultCredential.name: 1}}); len(got) == 0 {
		t.Error("Vault's token on the credential path: no problem found")
	}
}

// A run through an egressd that logged no egress line did not go through it
// (a transparent listener the DNAT missed): a problem of its row.
func TestEgressdLegNoEgressLine(t *testing.T) {
	ps, _ := lookupPaths("plain")
	r := egressdRow(t.Context(), pathEnv{o: options{rounds: 1}}, ps[0], &world{}, nil, loadOptions{}, newRow("plain", "", ""))
	x := viaRun{r: runResult{UpstreamRequests: 10}, log: logSummary{EgressLines: 10, Allowed200: 10}}
	if got := r.check(0, runResult{UpstreamRequests: 10}, &x); len(got) != 0 {
		t.Errorf("problems with every request logged: %q", got)
	}
	x.log = logSummary{}
	if got := r.check(0, runResult{UpstreamRequests: 10}, &x); len(got) != 1 || !strings.Contains(got[0], "logged no egress line") {
		t.Errorf("problems with nothing logged = %q, want the missing egress lines", got)
	}
}

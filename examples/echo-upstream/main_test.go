package main

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestEcho(t *testing.T) {
	req := httptest.NewRequest("POST", "https://localhost:8443/p?q=1", strings.NewReader("hello"))
	req.Header.Add("X-Demo-Injected", "hello-from-egressd")
	req.Header.Add("Authorization", "Bearer x")
	rec := httptest.NewRecorder()
	echo(rec, req)
	var got received
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	if got.Method != "POST" || got.Host != "localhost:8443" || got.Path != "/p" || got.Query != "q=1" || !got.TLS || got.BodyBytes != 5 {
		t.Errorf("echo = %+v", got)
	}
	if h := got.Headers["X-Demo-Injected"]; len(h) != 1 || h[0] != "hello-from-egressd" || got.Headers["Authorization"][0] != "Bearer x" {
		t.Errorf("headers = %v", got.Headers)
	}
}

func TestPKI(t *testing.T) {
	caPEM, leaf, err := newPKI()
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	if block == nil {
		t.Fatal("CA is not PEM")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	cert, err := x509.ParseCertificate(leaf.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"localhost", "127.0.0.1", "::1"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: roots}); err == nil {
		t.Error("leaf valid for example.com")
	}
}

func TestLoopbackOnly(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:8443", "[::1]:8443"} {
		if err := loopbackOnly(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{":8443", "0.0.0.0:8443", "localhost:8443", "10.0.0.1:8443"} {
		if loopbackOnly(bad) == nil {
			t.Errorf("%s allowed", bad)
		}
	}
}

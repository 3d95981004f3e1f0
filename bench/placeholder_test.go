package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/config"
)

// The upstream takes a body only with the value once and no placeholder: a
// placeholder egressd left in place is a 422, so a client error.
func TestServePlaceholder(t *testing.T) {
	ph := placeholderPrefix + placeholderCredential + "_0123456789abcdef0123456789abcdef"
	if n := len(placeholderBody(ph)); n != placeholderBodySize {
		t.Fatalf("body is %d bytes, want %d", n, placeholderBodySize)
	}
	for _, tc := range []struct {
		name string
		body []byte
		want int
	}{
		{"replaced", placeholderBody(placeholderValue), http.StatusOK},
		{"left in place", placeholderBody(ph), http.StatusUnprocessableEntity},
		{"value and placeholder", []byte(placeholderValue + ph), http.StatusUnprocessableEntity},
		{"value twice", []byte(placeholderValue + placeholderValue), http.StatusUnprocessableEntity},
	} {
		rec := httptest.NewRecorder()
		servePlaceholder(rec, httptest.NewRequest(http.MethodPost, placeholderPath, bytes.NewReader(tc.body)), []byte("ok"))
		if rec.Code != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, rec.Code, tc.want)
		}
	}
}

// The path's egressd config loads, with its policy file's env section and the
// environment_variable credential.
func TestPlaceholderConfig(t *testing.T) {
	up := &upstream{httpAddr: "127.0.0.1:1080", tlsAddr: "127.0.0.1:1443", caPEM: []byte("pem")}
	dir := t.TempDir()
	path, err := writePlaceholderConfig(dir, up, "127.0.0.1:5353")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(path); err != nil {
		t.Errorf("config: %v", err)
	}
	pol, _ := os.ReadFile(filepath.Join(dir, "environment.json"))
	creds, _ := os.ReadFile(filepath.Join(dir, "credentials.json"))
	if !strings.Contains(string(pol), `"env": {"`+placeholderEnvName+`": {"credential": "`+placeholderCredential+`"}}`) {
		t.Errorf("policy lacks the env section:\n%s", pol)
	}
	if !strings.Contains(string(creds), `"type": "environment_variable"`) {
		t.Errorf("credentials lack the environment_variable credential:\n%s", creds)
	}
}

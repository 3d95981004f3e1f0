package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
	cfg, files := placeholderConfig(testUpstream(), "127.0.0.1:5353")
	pol, creds := files["environment.json"], files[credentialsFile]
	loadConfig(t, cfg, files)
	if !strings.Contains(pol, `"env": {"`+placeholderEnvName+`": {"credential": "`+placeholderCredential+`"}}`) {
		t.Errorf("policy lacks the env section:\n%s", pol)
	}
	if !strings.Contains(creds, `"type": "environment_variable"`) {
		t.Errorf("credentials lack the environment_variable credential:\n%s", creds)
	}
}

package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseFlags(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"-upstream-ca", ca, "-ca-cert", "c", "-ca-key", "k", "-mitm-hosts", " Inject.Bench.Test, localhost ,"})
	if err != nil || len(o.mitmHosts) != 2 || !o.mitmHosts["inject.bench.test"] || !o.mitmHosts["localhost"] || !o.certCache || o.listen != "127.0.0.1:0" {
		t.Errorf("parseFlags = %+v, %v", o, err)
	}
	for _, bad := range [][]string{
		{},                                       // no -upstream-ca
		{"-upstream-ca", ca, "-mitm-hosts", "x"}, // MITM without a CA
		{"-upstream-ca", ca, "-max-idle-per-host", "0"},
		{"-upstream-ca", ca, "extra"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q): no error", bad)
		}
	}
}

func TestLoopbackOnly(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:80", "127.9.9.9:1", "[::1]:443"} {
		if err := loopbackOnly(ok); err != nil {
			t.Errorf("loopbackOnly(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"10.0.0.1:80", "localhost:80", "[::ffff:8.8.8.8]:53", "127.0.0.1"} {
		if loopbackOnly(bad) == nil {
			t.Errorf("loopbackOnly(%q) = nil", bad)
		}
	}
}

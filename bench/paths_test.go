package main

import "testing"

func TestLookupPaths(t *testing.T) {
	got, err := lookupPaths(" connect, plain ")
	if err != nil || len(got) != 2 || got[0].name != "connect" || got[1].name != "plain" {
		t.Errorf("lookupPaths = %v, %v", got, err)
	}
	for _, bad := range []string{"", ",", "plain,plain", "intercept"} {
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

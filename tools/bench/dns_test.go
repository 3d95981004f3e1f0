package main

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestDNSStub(t *testing.T) {
	s, err := startDNS()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The resolver egressd builds for network.resolver, pointed at the stub.
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, s.Addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, name := range []string{"inject.bench.test", "CRED.Bench.Test", "bench.test"} {
		ips, err := r.LookupNetIP(ctx, "ip", name)
		if err != nil || len(ips) != 1 || ips[0].String() != "127.0.0.1" {
			t.Errorf("%s: %v, %v", name, ips, err)
		}
	}
	if ips, err := r.LookupNetIP(ctx, "ip", "example.com"); err == nil {
		t.Errorf("example.com resolved to %v", ips)
	}
	if int64(s.Total()) == 0 {
		t.Error("no queries counted")
	}
	for _, name := range []string{"a.b.bench.test", "xbench.test", "bench.test.evil"} {
		ips, err := r.LookupNetIP(ctx, "ip", name)
		if in := name == "a.b.bench.test"; in != (err == nil) {
			t.Errorf("%s: %v, %v; in the zone: %v", name, ips, err, in)
		}
	}
}

package allowlist

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestParseAuthority(t *testing.T) {
	tests := []struct {
		in          string
		defaultPort uint16
		want        Target
	}{
		{"example.com:443", 0, Target{Host: "example.com", Port: 443}},
		{"Example.COM.:8080", 0, Target{Host: "example.com", Port: 8080}},
		{"example.com", 80, Target{Host: "example.com", Port: 80}},
		{"example.com:0443", 0, Target{Host: "example.com", Port: 443}},
		{"example.com:65535", 0, Target{Host: "example.com", Port: 65535}},
		{"[::1]:443", 0, Target{Host: "::1", Addr: netip.MustParseAddr("::1"), Port: 443}},
		{"[::1]", 443, Target{Host: "::1", Addr: netip.MustParseAddr("::1"), Port: 443}},
		{"::1", 443, Target{Host: "::1", Addr: netip.MustParseAddr("::1"), Port: 443}},
		{"2001:db8::1", 80, Target{Host: "2001:db8::1", Addr: netip.MustParseAddr("2001:db8::1"), Port: 80}},
		{"127.1:80", 0, Target{Host: "127.0.0.1", Addr: netip.MustParseAddr("127.0.0.1"), Port: 80}},
		{"bücher.example:443", 0, Target{Host: "xn--bcher-kva.example", Port: 443}},
	}
	for _, tt := range tests {
		got, err := ParseAuthority(tt.in, tt.defaultPort)
		if err != nil || got != tt.want {
			t.Errorf("ParseAuthority(%q, %d) = %+v, %v; want %+v", tt.in, tt.defaultPort, got, err, tt.want)
		}
	}
}

func TestParseAuthorityErrors(t *testing.T) {
	tests := []struct {
		in          string
		defaultPort uint16
		wantMsg     string
	}{
		{"", 443, "empty host"},
		{"host:0", 443, "out of range"},
		{"host:", 443, "empty port"},
		{"host:99999", 443, "out of range"},
		{"host:65536", 443, "out of range"},
		{"host:abc", 443, "not a number"},
		{"host:+443", 443, "not a number"},
		{"host: 443", 443, "not a number"},
		{":443", 443, "missing the host"},
		{"[::1", 443, "missing \"]\""},
		{"[::1]x", 443, "not a port"},
		{"[::1]:", 443, "empty port"},
		{"::1", 0, "missing port"},
		{"host", 0, "missing port"},
		{"user@host:443", 0, "userinfo"},
		{"[fe80::1%25eth0]:443", 0, "zone"},
		{"[]:443", 0, "IPv6"},
		{"a:b:c", 443, "IPv6"},
	}
	for _, tt := range tests {
		got, err := ParseAuthority(tt.in, tt.defaultPort)
		if err == nil || !errors.Is(err, ErrBadHost) || !strings.Contains(err.Error(), tt.wantMsg) {
			t.Errorf("ParseAuthority(%q, %d) = %+v, %v; want an ErrBadHost error containing %q", tt.in, tt.defaultPort, got, err, tt.wantMsg)
		}
	}
}

func TestTargetString(t *testing.T) {
	tests := []struct {
		in   Target
		want string
	}{
		{Target{Host: "example.com", Port: 443}, "example.com:443"},
		{Target{Host: "10.0.0.1", Addr: netip.MustParseAddr("10.0.0.1"), Port: 80}, "10.0.0.1:80"},
		{Target{Host: "::1", Addr: netip.MustParseAddr("::1"), Port: 443}, "[::1]:443"},
	}
	for _, tt := range tests {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("%+v.String() = %q; want %q", tt.in, got, tt.want)
		}
		if tt.in.IsIP() != tt.in.Addr.IsValid() {
			t.Errorf("%+v.IsIP() = %v", tt.in, tt.in.IsIP())
		}
	}
}

package allowlist

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestNormalizeHostNames(t *testing.T) {
	tests := []struct{ in, want string }{
		{"example.com", "example.com"},
		{"EXAMPLE.COM.", "example.com"},
		{"A.Example.Com.", "a.example.com"},
		{"bücher.example", "xn--bcher-kva.example"},
		{"BÜCHER.example", "xn--bcher-kva.example"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"XN--BCHER-KVA.EXAMPLE", "xn--bcher-kva.example"},
		{"example\u3002com", "example.com"}, // ideographic full stop
		{"ｅｘａｍｐｌｅ.com", "example.com"},      // full-width letters
		{"r3---sn-apo3qvuoxuxbt-j5pe.googlevideo.com", "r3---sn-apo3qvuoxuxbt-j5pe.googlevideo.com"},
		{"_dmarc.example.com", "_dmarc.example.com"},
		{"1a.example", "1a.example"},
		{"example.123abc", "example.123abc"},
		{"example.0x1g", "example.0x1g"},
		{"localhost", "localhost"},
		{strings.Repeat("a", 63) + ".com", strings.Repeat("a", 63) + ".com"},
	}
	for _, tt := range tests {
		host, addr, err := NormalizeHost(tt.in)
		if err != nil || host != tt.want || addr.IsValid() {
			t.Errorf("NormalizeHost(%q) = %q, %v, %v; want %q, name", tt.in, host, addr, err, tt.want)
		}
	}
}

func TestNormalizeHostIPs(t *testing.T) {
	tests := []struct{ in, want string }{
		{"127.0.0.1", "127.0.0.1"},
		{"127.0.0.1.", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0X7F000001", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"0x7f.0.0.1", "127.0.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"１２７.０.０.１", "127.0.0.1"}, // full-width digits map before the IPv4 parse
		{"1.2.3", "1.2.0.3"},
		{"0x", "0.0.0.0"},
		{"0", "0.0.0.0"},
		{"4294967295", "255.255.255.255"},
		{"[::1]", "::1"},
		{"::1", "::1"},
		{"[0:0:0:0:0:0:0:1]", "::1"},
		{"[::ffff:127.0.0.1]", "::ffff:127.0.0.1"},
		{"[::FFFF:7F00:1]", "::ffff:127.0.0.1"},
		{"[2001:DB8::1]", "2001:db8::1"},
	}
	for _, tt := range tests {
		host, addr, err := NormalizeHost(tt.in)
		if err != nil || host != tt.want || addr != netip.MustParseAddr(tt.want) {
			t.Errorf("NormalizeHost(%q) = %q, %v, %v; want IP %q", tt.in, host, addr, err, tt.want)
		}
	}
}

func TestNormalizeHostErrors(t *testing.T) {
	tests := []struct{ in, wantMsg string }{
		{"", "empty"},
		{".", "empty"},
		{" example.com", "whitespace"},
		{"exa mple.com", "whitespace"},
		{"example.com\n", "control"},
		{"example\x00.com", "control"},
		{"[fe80::1%25eth0]", "zone"},
		{"fe80::1%eth0", "zone"},
		{"user@example.com", "userinfo"},
		{"example.com/path", "path"},
		{"a..b", "empty label"},
		{"example.com..", "empty label"},
		{strings.Repeat("a", 64) + ".com", "label longer"},
		{strings.Repeat("abcdefghi.", 26) + "com", "longer than 253"},
		{strings.Repeat("a", 2000), "longer than 1012 bytes"},
		{"xn--a.example", "internationalised"},    // invalid punycode
		{"xn--abc-.example", "internationalised"}, // decodes to ASCII
		{"ℸa.example", "internationalised"},       // maps to Hebrew: fails the Bidi rule (found by fuzzing)
		{"xn--a-5hc.example", "internationalised"},
		{"1.2.3.4.5", "not a valid IPv4"},
		{"256.256.256.256", "not a valid IPv4"},
		{"256.1.1.1", "not a valid IPv4"},
		{"0x100000000", "not a valid IPv4"},
		{"4294967296", "not a valid IPv4"},
		{"1.2.3.256.", "not a valid IPv4"},
		{"1.2.65536", "not a valid IPv4"},
		{"example.123", "not a valid IPv4"},
		{"example.0x1f", "not a valid IPv4"},
		{"09.1.1.1", "not a valid IPv4"}, // octal with a 9
		{"[1.2.3.4]", "IPv6"},
		{"[::1", "brackets"},
		{"::1]", "IPv6"},
		{"example.com:443", "without a port"},
		{"exa*mple.com", "not allowed"},
		{"ex!ample.com", "not allowed"},
		{"\xff.example", "UTF-8"},
	}
	for _, tt := range tests {
		host, _, err := NormalizeHost(tt.in)
		if err == nil || !errors.Is(err, ErrBadHost) || !strings.Contains(err.Error(), tt.wantMsg) {
			t.Errorf("NormalizeHost(%q) = %q, %v; want an ErrBadHost error containing %q", tt.in, host, err, tt.wantMsg)
		}
	}
}

// The ASCII and Unicode spellings of one IDN are the same host.
func TestNormalizeHostIDNAEquivalence(t *testing.T) {
	a, _, errA := NormalizeHost("bücher.example")
	b, _, errB := NormalizeHost("xn--bcher-kva.example")
	if errA != nil || errB != nil || a != b {
		t.Fatalf("got %q (%v) and %q (%v); want equal", a, errA, b, errB)
	}
}

package conformance_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/testutil/badnames"
)

// addressCase is one request for an internal address and the refusal it must get.
type addressCase struct {
	name   string
	host   string // as written in a URL: brackets around IPv6
	status int
	reason string
	detail string
	// connect also sends CONNECT host:443 and expects the same refusal.
	connect bool
}

// TestInternalAddressSpellings: with a "*" entry every host matches, so only the
// address guard stands between the sandbox and an internal address, however it is
// spelt. Each spelling is refused with internal_address and the class of the
// address it denotes (or bad_request where it is no host at all), as an
// absolute-form GET and as a CONNECT, and no canary sees a connection.
func TestInternalAddressSpellings(t *testing.T) {
	w := newWorld(t, config{allowlist: starAllowlist})
	deny := func(name, host, detail string) addressCase {
		return addressCase{name, host, 403, "internal_address", detail, true}
	}
	bad := func(name, host string) addressCase {
		return addressCase{name, host, 400, "bad_request", "", false}
	}
	cases := []addressCase{
		deny("dotted loopback", "127.0.0.1", "loopback"),
		deny("short loopback", "127.1", "loopback"),
		deny("decimal loopback", "2130706433", "loopback"),
		deny("octal loopback", "0177.0.0.1", "loopback"),
		deny("octal short loopback", "0177.1", "loopback"),
		deny("hex loopback", "0x7f.0.0.1", "loopback"),
		deny("hex whole loopback", "0x7f000001", "loopback"),
		deny("uppercase hex loopback", "0X7F.1", "loopback"),
		deny("zero-padded loopback", "127.000.000.001", "loopback"),
		deny("other loopback address", "127.53.0.1", "loopback"),
		deny("trailing dot loopback", "127.0.0.1.", "loopback"),
		deny("trailing dot decimal loopback", "2130706433.", "loopback"),
		deny("dotted metadata", "169.254.169.254", "metadata"),
		deny("decimal metadata", "2852039166", "metadata"),
		deny("octal metadata", "0251.0376.0251.0376", "metadata"),
		deny("hex metadata", "0xa9fea9fe", "metadata"),
		deny("short metadata", "169.254.43518", "metadata"),
		deny("ECS metadata", "169.254.170.2", "metadata"),
		deny("Alibaba metadata", "100.100.100.200", "metadata"),
		deny("Azure WireServer", "168.63.129.16", "metadata"),
		deny("EKS Pod Identity", "169.254.170.23", "metadata"),
		deny("link-local", "169.254.1.1", "link_local"),
		deny("private", "10.0.0.5", "private"),
		deny("short private", "10.5", "private"),
		deny("private 172.16/12", "172.16.0.5", "private"),
		deny("private 192.168/16", "192.168.1.5", "private"),
		deny("cgnat", "100.64.0.5", "cgnat"),
		deny("decimal cgnat", "1681915909", "cgnat"),
		deny("unspecified", "0.0.0.0", "unspecified"),
		deny("zero", "0", "unspecified"),
		deny("broadcast", "255.255.255.255", "broadcast"),
		deny("multicast", "224.0.0.1", "multicast"),
		deny("reserved TEST-NET-1", "192.0.2.1", "reserved"),
		deny("IPv6 loopback", "[::1]", "loopback"),
		deny("IPv6 loopback long form", "[0:0:0:0:0:0:0:1]", "loopback"),
		deny("IPv6 unspecified", "[::]", "unspecified"),
		deny("IPv6 metadata", "[fd00:ec2::254]", "metadata"),
		deny("IPv6 metadata uppercase long form", "[FD00:0EC2:0:0:0:0:0:0254]", "metadata"),
		deny("GCP IPv6 metadata", "[fd20:ce::254]", "metadata"),
		deny("IPv6 link-local", "[fe80::1]", "link_local"),
		deny("IPv6 ULA", "[fd12::5]", "private"),
		deny("IPv6 site-local", "[fec0::5]", "private"),
		deny("EKS Pod Identity IPv6", "[fd00:ec2::23]", "metadata"),
		deny("OCI IPv6 metadata", "[fd00:c1::a9fe:a9fe]", "metadata"),
		deny("v4-mapped Azure WireServer", "[::ffff:168.63.129.16]", "metadata"),
		deny("IPv6 multicast", "[ff02::1]", "multicast"),
		deny("v4-mapped loopback", "[::ffff:127.0.0.1]", "loopback"),
		deny("v4-mapped loopback in hex", "[::ffff:7f00:1]", "loopback"),
		deny("v4-mapped metadata", "[::ffff:169.254.169.254]", "metadata"),
		deny("v4-mapped metadata in hex", "[::ffff:a9fe:a9fe]", "metadata"),
		deny("v4-mapped private", "[::ffff:10.0.0.5]", "private"),
		deny("v4-compatible loopback", "[::127.0.0.1]", "loopback"),
		deny("v4-compatible metadata", "[::169.254.169.254]", "metadata"),
		deny("NAT64 loopback", "[64:ff9b::7f00:1]", "loopback"),
		deny("NAT64 metadata", "[64:ff9b::169.254.169.254]", "metadata"),
		deny("NAT64 private", "[64:ff9b::a00:5]", "private"),
		deny("6to4 loopback", "[2002:7f00:1::1]", "loopback"),
		deny("6to4 metadata", "[2002:a9fe:a9fe::1]", "metadata"),
		deny("6to4 private", "[2002:a00:5::1]", "private"),
		deny("Teredo client loopback", "[2001:0:4136:e378:8000:63bf:80ff:fffe]", "loopback"),
		deny("Teredo client metadata", "[2001:0:4136:e378:8000:63bf:5601:5601]", "metadata"),
		bad("IPv6 zone ID", "[fe80::1%25eth0]"),
		bad("IPv6 zone ID on loopback", "[::1%25lo]"),
		bad("IPv6 zone ID on metadata", "[fd00:ec2::254%251]"),
		bad("percent-encoded loopback", "%31%32%37.0.0.1"),
		bad("IPv4 with five parts", "127.0.0.0.1"),
		bad("IPv4 part out of range", "127.0.0.256"),
		bad("unbracketed IPv6", "::1"),
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			k.refused(k.raw("GET http://"+tc.host+"/latest/meta-data/ HTTP/1.1\r\nHost: "+tc.host+"\r\n\r\n"),
				tc.status, tc.reason, tc.detail)
			if tc.connect {
				authority := connectAuthority(tc.host, "443")
				k.refused(k.raw("CONNECT "+authority+" HTTP/1.1\r\nHost: "+authority+"\r\n\r\n"),
					tc.status, tc.reason, tc.detail)
			}
			k.assertUpstreamSaw(0)
		})
	}
}

// TestBadNames: a host that is not a DNS name is refused with bad_request, detail
// bad_name, as a GET and as a CONNECT, before any DNS query: the stub sees none.
func TestBadNames(t *testing.T) {
	w := newWorld(t, config{})
	for _, tc := range badnames.Under("allowed.test") {
		t.Run(tc.Name, func(t *testing.T) {
			k := w.begin(t)
			before := w.DNS.Total()
			k.refused(k.raw("GET http://"+tc.Host+"/ HTTP/1.1\r\nHost: "+tc.Host+"\r\n\r\n"), 400, "bad_request", "bad_name")
			authority := connectAuthority(tc.Host, "443")
			k.refused(k.raw("CONNECT "+authority+" HTTP/1.1\r\nHost: "+authority+"\r\n\r\n"), 400, "bad_request", "bad_name")
			if n := w.DNS.Total() - before; n != 0 {
				t.Errorf("the DNS stub saw %d queries, want 0", n)
			}
			k.assertUpstreamSaw(0)
		})
	}
}

// connectAuthority joins a URL host (IPv6 in brackets) and a port.
func connectAuthority(host, port string) string {
	return net.JoinHostPort(strings.Trim(host, "[]"), port)
}

// TestDNSTricks: an allowlisted name whose DNS answers point inside is refused
// with the class of the internal answer, for a plain request and for a CONNECT;
// a name that rebinds is decided again on every resolution, and a connection is
// only ever made to an address that was checked.
func TestDNSTricks(t *testing.T) {
	w := newWorld(t, config{})
	cases := []struct{ name, host, detail string }{
		{"name resolves to loopback", "loopback.allowed.test", "loopback"},
		{"name resolves to metadata", "metadata.allowed.test", "metadata"},
		{"name resolves to private", "private.allowed.test", "private"},
		{"name resolves to cgnat", "cgnat.allowed.test", "cgnat"},
		{"mixed public and private A answers", "mixed.allowed.test", "private"},
		{"public A and loopback AAAA", "mixed6.allowed.test", "loopback"},
		{"CNAME to a private name", "cname.allowed.test", "private"},
		{"CNAME to a metadata name", "cname-meta.allowed.test", "metadata"},
		{"AAAA-only loopback", "aaaa-loopback.allowed.test", "loopback"},
		{"AAAA-only IPv6 metadata", "aaaa-metadata.allowed.test", "metadata"},
		{"AAAA-only v4-mapped loopback", "aaaa-mapped.allowed.test", "loopback"},
		{"AAAA-only NAT64 metadata", "aaaa-nat64.allowed.test", "metadata"},
		{"trailing dot", "loopback.allowed.test.", "loopback"},
		{"mixed case", "METADATA.Allowed.Test", "metadata"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			k.refused(k.raw("GET http://"+tc.host+"/ HTTP/1.1\r\nHost: "+tc.host+"\r\n\r\n"), 403, "internal_address", tc.detail)
			k.refused(k.raw("CONNECT "+tc.host+":443 HTTP/1.1\r\nHost: "+tc.host+":443\r\n\r\n"), 403, "internal_address", tc.detail)
			k.assertUpstreamSaw(0)
		})
	}
	t.Run("rebinding: first answer public, then loopback", func(t *testing.T) {
		k := w.begin(t)
		k.connect("rebind.allowed.test:443").Close()
		k.refused(k.raw("CONNECT rebind.allowed.test:443 HTTP/1.1\r\nHost: rebind.allowed.test:443\r\n\r\n"),
			403, "internal_address", "loopback")
	})
	t.Run("rebinding: first answer private, then public", func(t *testing.T) {
		k := w.begin(t)
		k.refused(k.raw("CONNECT unbind.allowed.test:443 HTTP/1.1\r\nHost: unbind.allowed.test:443\r\n\r\n"),
			403, "internal_address", "private")
		k.connect("unbind.allowed.test:443").Close()
	})
	t.Run("TTL 0: answers alternate between public and metadata", func(t *testing.T) {
		k := w.begin(t)
		for i := range 6 {
			if i%2 == 0 {
				k.connect("flip.allowed.test:443").Close()
				continue
			}
			k.refused(k.raw("CONNECT flip.allowed.test:443 HTTP/1.1\r\nHost: flip.allowed.test:443\r\n\r\n"),
				403, "internal_address", "metadata")
		}
	})
	t.Run("rebinding between plain requests never reaches loopback", func(t *testing.T) {
		// The first request resolves to the public address. A later one either reuses
		// the upstream connection to that checked address or resolves again and is
		// refused; it never connects to what the name now says.
		w.DNS.SetFunc("rebind-get.allowed.test", func(n int) []string {
			if n == 0 {
				return []string{"A " + publicIP}
			}
			return []string{"A 127.0.0.1"}
		})
		k := w.begin(t)
		got := k.echo(k.get("http://rebind-get.allowed.test/first"))
		if got.Path != "/first" {
			t.Errorf("upstream saw %+v", got)
		}
		for range 3 {
			resp := k.get("http://rebind-get.allowed.test/again")
			if resp.StatusCode == http.StatusOK {
				k.echo(resp)
				continue
			}
			k.refused(resp, 403, "internal_address", "loopback")
		}
	})
}

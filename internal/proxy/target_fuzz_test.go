package proxy

import (
	"bufio"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
)

// FuzzForwardTarget: any request-target that net/http's parser accepts in an
// absolute-form request line goes through forwardTarget without a panic; when it is
// accepted the target is what the URL names and nothing else: scheme http or https,
// no userinfo, the URL's host normalised (a host that normalises to itself), and
// its explicit port or the scheme's default.
func FuzzForwardTarget(f *testing.F) {
	for _, s := range []string{
		"http://allowed.test/", "https://allowed.test:8443/x?y", "HTTP://ALLOWED.TEST./", "http://a@allowed.test/",
		"http://allowed.test@evil.test/", "http://[::1]/", "http://[::ffff:127.0.0.1]:80/", "http://[fe80::1%25eth0]/",
		"http://127.1/", "http://0x7f.1/", "http://2130706433/", "http://%31%32%37.0.0.1/", "http://bücher.test/",
		"http://xn--bcher-kva.test/", "ftp://allowed.test/", "http://allowed.test:0/", "http://allowed.test:/",
		"http://allowed.test:65536/", "/relative", "*", "http:///path", "http://:80/", "http://a.test:80:80/",
		"http://evil.test\\@allowed.test/", "http://allowed.test%2eevil.test/", "https://[::1]:443/", "http://ａｌｌｏｗｅｄ.test/",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		if strings.ContainsAny(target, " \r\n") {
			return // not one request-target
		}
		req, err := readRequestLine("GET " + target + " HTTP/1.1\r\nHost: h\r\n\r\n")
		if err != nil {
			return
		}
		got, err := forwardTarget(req)
		if err != nil {
			return
		}
		u := req.URL
		port, ok := allowlist.SchemePort(u.Scheme)
		if !ok || u.User != nil {
			t.Fatalf("%q: accepted scheme %q, userinfo %v", target, u.Scheme, u.User)
		}
		if p := u.Port(); p != "" {
			n, err := strconv.ParseUint(p, 10, 16)
			if err != nil {
				t.Fatalf("%q: accepted port %q", target, p)
			}
			port = uint16(n)
		}
		if got.Port != port || got.Port == 0 {
			t.Fatalf("%q: port %d, want %d", target, got.Port, port)
		}
		host, addr, err := allowlist.NormalizeHost(hostOf(u))
		if err != nil || host != got.Host || addr != got.Addr {
			t.Fatalf("%q: target %+v, but the URL's host %q normalises to %q %v (%v)", target, got, hostOf(u), host, addr, err)
		}
		again, _, err := allowlist.NormalizeHost(got.Host)
		if err != nil || again != got.Host {
			t.Fatalf("%q: target host %q is not normal: %q %v", target, got.Host, again, err)
		}
		if strings.ContainsAny(got.Host, "@%/\\?# ") {
			t.Fatalf("%q: target host %q", target, got.Host)
		}
	})
}

// hostOf returns the URL's host as it appears in the authority, brackets kept.
func hostOf(u *url.URL) string {
	h := u.Host
	if p := u.Port(); p != "" {
		h = strings.TrimSuffix(h, ":"+p)
	}
	return strings.TrimSuffix(h, ":")
}

func readRequestLine(s string) (*http.Request, error) {
	return http.ReadRequest(bufio.NewReader(strings.NewReader(s)))
}

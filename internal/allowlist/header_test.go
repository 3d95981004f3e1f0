package allowlist

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// The one Header type (credential.Header is it) redacts its value in every
// rendering, zerolog included.
func TestHeaderRedactsEverywhere(t *testing.T) {
	const secret = "sk-live-SECRET"
	h := Header{Name: "Authorization", Value: secret}
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	log.Info().Object("h", h).Msg("")
	outs := []string{buf.String()}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		outs = append(outs, fmt.Sprintf(verb, h), fmt.Sprintf(verb, []Header{h}))
	}
	for _, out := range outs {
		if strings.Contains(out, secret) || strings.Contains(out, fmt.Sprintf("%x", secret)) {
			t.Errorf("rendering shows the secret: %s", out)
		}
	}
}

func TestReservedHeader(t *testing.T) {
	for _, name := range append([]string{"Egressd-Reason", "Proxy-Foo", "Host", "Content-Length"}, HopByHop...) {
		if ReservedHeader(name) == "" {
			t.Errorf("%s may be injected", name)
		}
	}
	for _, name := range []string{"Authorization", "X-Api-Key", "Cookie"} {
		if why := ReservedHeader(name); why != "" {
			t.Errorf("%s is refused: %s", name, why)
		}
	}
}

// URLTarget is what the proxy and explain read a URL with.
func TestURLTarget(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want error
		t    string
	}{
		{"http://Example.COM./x", nil, "example.com:80"},
		{"https://[::1]/", nil, "[::1]:443"},
		{"HTTPS://a.test:8443", nil, "a.test:8443"},
		{"/origin-form", ErrNotAbsolute, ""},
		{"http:///nohost", ErrNotAbsolute, ""},
		{"http://allowed.test@evil.test/", ErrUserinfo, ""},
		{"ftp://a.test/", ErrScheme, ""},
		{"http://a.test:0/", ErrBadHost, ""},
	} {
		u, err := url.Parse(tc.raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := URLTarget(u)
		if !errors.Is(err, tc.want) || (tc.want == nil && got.String() != tc.t) {
			t.Errorf("URLTarget(%q) = %v, %v; want %s, %v", tc.raw, got, err, tc.t, tc.want)
		}
	}
}

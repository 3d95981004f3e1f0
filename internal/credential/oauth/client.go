package oauth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/oauth2"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/netguard"
)

// NewClient returns the HTTP client of token calls: every connection passes the address
// guard (resolved with r, each answer classified, the checked address dialled, the
// dialer's Control hook checking again), upstream certificates are verified with
// tlsConf's roots (system roots plus tls.upstream_ca_file), no proxy from the environment
// is used and redirects are not followed. dial bounds each connect.
func NewClient(g *netguard.Guard, r *netguard.Resolver, tlsConf *tls.Config, dial time.Duration) *http.Client {
	d := g.NewDialer(dial)
	var tc *tls.Config
	if tlsConf != nil {
		tc = tlsConf.Clone()
	}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, address string) (net.Conn, error) {
			host, portStr, err := net.SplitHostPort(address)
			if err != nil {
				return nil, err
			}
			port, err := strconv.ParseUint(portStr, 10, 16)
			if err != nil {
				return nil, fmt.Errorf("oauth: bad port in %q", address)
			}
			name, addr, err := allowlist.NormalizeHost(host)
			if err != nil {
				return nil, err
			}
			addrs, err := g.Resolve(ctx, r, name, addr, uint16(port))
			if err != nil {
				return nil, err
			}
			return d.DialAddrs(ctx, addrs)
		},
		TLSClientConfig:     tc,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}
	return &http.Client{
		Transport:     tr,
		Timeout:       callTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// describe renders a token-call error without anything the endpoint sent back beyond its
// status and RFC 6749 error code (its body may quote what it was sent), with every
// secret replaced.
func describe(err error, secrets ...string) string {
	var re *oauth2.RetrieveError
	msg := err.Error()
	if errors.As(err, &re) {
		msg = "the token endpoint answered"
		if re.Response != nil {
			msg += " " + re.Response.Status
		}
		if re.ErrorCode != "" {
			msg += " (error " + strconv.Quote(re.ErrorCode) + ")"
		}
	}
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
		}
	}
	return msg
}

package allowlist

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// Target is a normalised destination: the policy host and port of a request
// or tunnel. Build it with ParseAuthority (or NormalizeHost); Decide relies
// on Host being normalised.
type Target struct {
	Host string     // normalised name, or the IP literal's canonical text (no brackets)
	Addr netip.Addr // valid when Host is an IP literal
	Port uint16
}

// IsIP reports whether the target is an IP literal rather than a name.
func (t Target) IsIP() bool { return t.Addr.IsValid() }

// String returns host:port, with brackets around an IPv6 host.
func (t Target) String() string {
	return net.JoinHostPort(t.Host, strconv.Itoa(int(t.Port)))
}

// ParseAuthority parses "host", "host:port", "[v6]" or "[v6]:port" (a CONNECT
// target or a Host header) and normalises the host. A bare IPv6 literal with
// several colons ("::1") is taken as a host without a port. A missing port
// gets defaultPort; when defaultPort is 0 a port is required. Port 0,
// non-numeric or above 65535 is an error. Errors wrap ErrBadHost.
func ParseAuthority(s string, defaultPort uint16) (Target, error) {
	rawHost, rawPort, hasPort, err := splitHostPort(s)
	if err != nil {
		return Target{}, err
	}
	port, err := resolvePort(rawPort, hasPort, defaultPort)
	if err != nil {
		return Target{}, err
	}
	host, addr, err := NormalizeHost(rawHost)
	if err != nil {
		return Target{}, err
	}
	return Target{Host: host, Addr: addr, Port: port}, nil
}

// splitHostPort separates the host from an optional port without judging
// either; the brackets stay on an IPv6 host.
func splitHostPort(s string) (host, port string, hasPort bool, err error) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", false, badHost("%s is missing \"]\"", quote(s))
		}
		host, rest := s[:end+1], s[end+1:]
		if rest == "" {
			return host, "", false, nil
		}
		if rest[0] != ':' {
			return "", "", false, badHost("%s has text after \"]\" that is not a port", quote(s))
		}
		return host, rest[1:], true, nil
	}
	if strings.Count(s, ":") != 1 {
		return s, "", false, nil // a name, or a bare IPv6 literal
	}
	host, port, _ = strings.Cut(s, ":")
	if host == "" {
		return "", "", false, badHost("%s is missing the host", quote(s))
	}
	return host, port, true, nil
}

// resolvePort applies the default and parses an explicit port.
func resolvePort(raw string, hasPort bool, defaultPort uint16) (uint16, error) {
	if !hasPort {
		if defaultPort == 0 {
			return 0, badHost("missing port")
		}
		return defaultPort, nil
	}
	return parsePort(raw)
}

// parsePort accepts decimal digits only (no sign, no spaces), 1 to 65535.
func parsePort(raw string) (uint16, error) {
	if raw == "" {
		return 0, badHost("empty port")
	}
	if strings.Trim(raw, "0123456789") != "" {
		return 0, badHost("port %s is not a number", quote(raw))
	}
	n, err := strconv.ParseUint(raw, 10, 16)
	if err != nil || n == 0 {
		return 0, badHost("port %s is out of range 1-65535", quote(raw))
	}
	return uint16(n), nil
}

// The ports a URL means when it names none: the schemes egressd proxies.
const (
	PortHTTP  uint16 = 80
	PortHTTPS uint16 = 443
)

// DefaultPorts are the ports an allowlist entry allows when neither it nor
// network.default_ports names any: plain HTTP and HTTPS. The slice is new.
func DefaultPorts() []uint16 { return []uint16{PortHTTP, PortHTTPS} }

// SchemePort returns the port of a URL of scheme (lower case, as url.Parse
// leaves it) that names none, and false for a scheme egressd does not proxy.
func SchemePort(scheme string) (uint16, bool) {
	switch scheme {
	case "http":
		return PortHTTP, true
	case "https":
		return PortHTTPS, true
	}
	return 0, false
}

// Errors of URLTarget besides ErrBadHost, for errors.Is.
var (
	ErrNotAbsolute = errors.New("not an absolute http:// or https:// URL")
	ErrUserinfo    = errors.New("userinfo in URL")
	ErrScheme      = errors.New("unsupported scheme")
)

// URLTargetDetail is the bad_request detail of an error from URLTarget: what the
// proxy answers an absolute-form request with, and explain reports, for the same URL.
func URLTargetDetail(err error) string {
	switch {
	case errors.Is(err, ErrNotAbsolute):
		return "not_proxy_request"
	case errors.Is(err, ErrUserinfo):
		return "userinfo"
	case errors.Is(err, ErrScheme):
		return "scheme"
	case errors.Is(err, ErrBadName):
		return "bad_name"
	}
	return "host"
}

// URLTarget returns the normalised target of an absolute http:// or https://
// URL: the proxy's absolute-form request target and explain's argument are read
// by this one function. A URL without a host, with userinfo ("allowed.test@evil.test")
// or of another scheme is refused, as is a host ParseAuthority refuses.
func URLTarget(u *url.URL) (Target, error) {
	if !u.IsAbs() || u.Host == "" {
		return Target{}, ErrNotAbsolute
	}
	if u.User != nil {
		return Target{}, ErrUserinfo
	}
	port, ok := SchemePort(u.Scheme)
	if !ok {
		return Target{}, fmt.Errorf("%w %s (use http or https)", ErrScheme, quote(u.Scheme))
	}
	return ParseAuthority(u.Host, port)
}

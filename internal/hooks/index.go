package hooks

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/pkg/hookauth"
)

// Match is what a hook URL stands for.
type Match struct {
	Group   string
	Event   string        // EventPre or EventPost
	Timeout time.Duration // the hook's timeout (DefaultTimeout when unset)
	URL     string        // the hook URL as written in hooks.json
	// Audience is the assertion's aud: the URL's origin (hookauth.Origin over the
	// normalised host), the same string a policy endpoint configures.
	Audience string
}

// Index maps the http hooks of the enabled groups by URL. It is immutable and safe for
// concurrent use; build a new one on reload.
//
// When several hooks share a URL, pre_tool_execution wins over post_tool_execution:
// fail-closed is the safer treatment of a call egressd cannot tell apart. Among hooks of
// the same event the first in document order names the group, and the shortest timeout
// applies, so that egressd's deny always comes before the runtime's own timeout.
type Index struct {
	byURL map[string]Match
	hosts map[string]bool // "host port" of every hook URL, for interception
	order []string        // byURL's keys in document order
}

// NewIndex indexes f; a nil f gives an empty index.
func NewIndex(f *File) *Index {
	ix := &Index{byURL: map[string]Match{}, hosts: map[string]bool{}}
	if f == nil {
		return ix
	}
	for _, g := range f.Groups {
		if !g.Enabled {
			continue
		}
		for _, ev := range events {
			for _, r := range g.Rules(ev) {
				for _, h := range r.Hooks {
					if h.Type == TypeHTTP && h.Target.Host != "" {
						ix.add(g.Name, ev, h)
					}
				}
			}
		}
	}
	return ix
}

// add indexes one http hook, applying the precedence documented on Index.
func (ix *Index) add(group, event string, h Hook) {
	k := urlKey(h.Scheme, h.Target.Host, h.Target.Port, h.PPath)
	m := Match{Group: group, Event: event, Timeout: h.Timeout, URL: h.URL, Audience: audience(h)}
	prev, seen := ix.byURL[k]
	switch {
	case !seen:
		ix.order = append(ix.order, k)
	case prev.Event == EventPre && event == EventPost:
		return
	case prev.Event == event:
		m.Group, m.URL = prev.Group, prev.URL
		m.Timeout = min(prev.Timeout, m.Timeout)
	}
	ix.byURL[k] = m
	ix.hosts[hostKey(h.Target.Host, h.Target.Port)] = true
}

// Lookup reports whether a request is a call to a hook URL: scheme ("http" or "https"),
// lower-cased and normalised host (allowlist.NormalizeHost), effective port and path in
// its RFC 3986 normal form (NormalizePath) must all be equal; the query is ignored. path
// is the request's escaped path as sent (r.URL.EscapedPath()); "" is "/".
func (ix *Index) Lookup(scheme, host string, port uint16, path string) (Match, bool) {
	if ix == nil || len(ix.byURL) == 0 {
		return Match{}, false
	}
	norm, _, err := allowlist.NormalizeHost(host)
	if err != nil {
		return Match{}, false
	}
	m, ok := ix.byURL[urlKey(strings.ToLower(scheme), norm, port, NormalizePath(path))]
	return m, ok
}

// Intercepts reports whether some hook URL names host and port: a tunnel there must be
// intercepted (tls.intercept auto includes hook URLs) so that its requests can be
// looked up, signed and guarded. host is normalised as by Lookup.
func (ix *Index) Intercepts(host string, port uint16) bool {
	if ix == nil || len(ix.hosts) == 0 {
		return false
	}
	norm, _, err := allowlist.NormalizeHost(host)
	return err == nil && ix.hosts[hostKey(norm, port)]
}

// Hosts returns the normalised hosts of the indexed URLs, sorted and without
// repeats: the hosts whose interception leaves egressd keeps pinned.
func (ix *Index) Hosts() []string {
	if ix == nil {
		return nil
	}
	var hosts []string
	for k := range ix.hosts {
		h, _, _ := strings.Cut(k, " ")
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	slices.Sort(hosts)
	return hosts
}

// Matches returns one Match per indexed URL, in document order.
func (ix *Index) Matches() []Match {
	if ix == nil {
		return nil
	}
	ms := make([]Match, len(ix.order))
	for i, k := range ix.order {
		ms[i] = ix.byURL[k]
	}
	return ms
}

// Len returns the number of indexed URLs.
func (ix *Index) Len() int {
	if ix == nil {
		return 0
	}
	return len(ix.byURL)
}

func urlKey(scheme, host string, port uint16, path string) string {
	return scheme + " " + hostKey(host, port) + " " + path
}

func hostKey(host string, port uint16) string { return host + " " + strconv.Itoa(int(port)) }

// audience is the aud claim of the assertions for h.
func audience(h Hook) string {
	aud, err := hookauth.Origin(h.Scheme + "://" + net.JoinHostPort(h.Target.Host, strconv.Itoa(int(h.Target.Port))))
	if err != nil {
		return "" // unreachable: Parse accepted the URL
	}
	return aud
}

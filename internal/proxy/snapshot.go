package proxy

import (
	"crypto/tls"
	"net/http"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/placeholder"
	mitm "github.com/egressd/egressd/internal/tls"
)

// Snapshot is one immutable snapshot of everything a request is decided and forwarded
// with. A reload builds a new Snapshot and swaps it in; a request keeps the Snapshot it
// started with.
type Snapshot struct {
	Env string
	// Sandbox is the node-mode sandbox this Snapshot serves ("" in a sidecar): its
	// records and hook assertions carry it. It never changes for a Server.
	Sandbox  string
	Policy   *allowlist.Policy
	Guard    *netguard.Guard
	Resolver *netguard.Resolver
	Limits   config.Limits
	// UpstreamTLS verifies upstream certificates (system roots plus tls.upstream_ca_file).
	// Nil means the system roots. InsecureSkipVerify is never set.
	UpstreamTLS *tls.Config
	// Injector sets each rule's headers; nil means no rule injects.
	Injector *inject.Injector
	// Leaves mints the certificates intercepted tunnels are terminated with; nil
	// means nothing is intercepted (a rule that needs it is refused at build).
	Leaves *mitm.Leaves
	// Hooks recognises and signs hook calls; nil when there are none.
	Hooks *Hooks
	// Placeholders replaces environment_variable placeholders in requests to their
	// trusted domains and refuses them elsewhere; nil when the policy has none.
	Placeholders *placeholder.Replacer
	// DenyInTunnel answers a refused CONNECT inside TLS (tls.deny_in_tunnel):
	// 200 carrying Egressd-Reason, a leaf for the requested name, the refusal
	// to the first request. False: the refusal replaces the 200.
	DenyInTunnel bool

	dialer *netguard.Dialer
	// transport speaks HTTP/2 to upstreams that offer it (for HTTP/2 clients: gRPC,
	// trailers); transportH1 speaks HTTP/1.1 only, for HTTP/1.x clients, so each
	// client connection maps onto a keep-alive upstream connection of its own rather
	// than every client sharing one multiplexed stream.
	transport   *http.Transport
	transportH1 *http.Transport
	// h1 serves HTTP/1.x GETs and HEADs without a body (h1pool.go).
	h1 *h1Pool
	// h2Only remembers the upstreams that refused ALPN http/1.1 (h2only.go).
	h2Only h2OnlySet
	// mem is the Server's memory budget (memory.go); nil grants everything.
	mem *membudget.Budget
}

// Prepare builds the Snapshot's dialer and transport. Call it once before use.
func (snap *Snapshot) Prepare() {
	if snap.Injector == nil {
		snap.Injector = inject.New(snap.Policy, nil)
	}
	snap.dialer = snap.Guard.NewDialer(snap.Limits.Dial)
	snap.transport = snap.newTransport(true)
	snap.transportH1 = snap.newTransport(false)
	snap.h1 = newH1Pool(snap)
}

// newTransport builds one upstream transport. It is not a Clone of the other:
// Transport.Clone settles the HTTP/2 defaults first and would copy "h2" into the
// HTTP/1.1 transport's ALPN list.
func (snap *Snapshot) newTransport(h2 bool) *http.Transport {
	tlsConf := snap.upstreamTLSConfig()
	tr := &http.Transport{
		// Never follow HTTP_PROXY/HTTPS_PROXY from egressd's own environment.
		Proxy:       nil,
		DialContext: snap.dialGuarded,
		// Compression is the client's business: asking for gzip and decompressing
		// would change what the sandbox receives.
		DisableCompression:     true,
		TLSClientConfig:        tlsConf,
		ForceAttemptHTTP2:      h2,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    256,
		IdleConnTimeout:        snap.Limits.UpstreamIdle,
		TLSHandshakeTimeout:    snap.Limits.Dial,
		ResponseHeaderTimeout:  snap.Limits.ResponseHeader,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	if h2 {
		tr.HTTP2 = &http.HTTP2Config{
			MaxReceiveBufferPerStream:     upstreamStreamWindow,
			MaxReceiveBufferPerConnection: upstreamConnWindow,
		}
	} else {
		tlsConf.NextProtos = []string{"http/1.1"}
		// A non-nil, empty TLSNextProto turns HTTP/2 off (net/http's documented switch).
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return tr
}

// Close releases the Snapshot's idle upstream connections.
func (snap *Snapshot) Close() {
	if snap.transport != nil {
		snap.transport.CloseIdleConnections()
		snap.transportH1.CloseIdleConnections()
		snap.h1.closeIdle()
	}
}

func (snap *Snapshot) upstreamTLSConfig() *tls.Config {
	if snap.UpstreamTLS != nil {
		return snap.UpstreamTLS.Clone()
	}
	return &tls.Config{MinVersion: tls.VersionTLS12}
}

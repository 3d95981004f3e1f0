package proxy

import (
	"crypto/tls"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/placeholder"
	"github.com/egressd/egressd/internal/proxy/upstream"
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

	// upstream dials decided targets and sends outbound requests (upstream/).
	upstream *upstream.Client
	// mem is the Server's memory budget (server.go); nil grants everything.
	mem *membudget.Budget
}

// Prepare builds the Snapshot's upstream client. Call it once before use.
func (snap *Snapshot) Prepare() {
	if snap.Injector == nil {
		snap.Injector = inject.New(snap.Policy, nil)
	}
	snap.upstream = upstream.New(upstream.Options{
		Guard: snap.Guard, Resolver: snap.Resolver, TLS: snap.UpstreamTLS, Limits: snap.Limits,
		StreamWindow: upstreamStreamWindow, ConnWindow: upstreamConnWindow,
		HoldWindow: snap.holdUpstreamWindow,
	})
}

// Close releases the Snapshot's idle upstream connections.
func (snap *Snapshot) Close() {
	if snap.upstream != nil {
		snap.upstream.CloseIdle()
	}
}

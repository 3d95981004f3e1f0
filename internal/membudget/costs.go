package membudget

// What a client connection costs egressd beyond its buffers that other holders
// count: every accepted connection reserves ConnCost from the budget (holder
// Conns), adds TunnelCost once it carries a tunnel and RequestCost while a
// request is forwarded, so that connections held open by the thousand are
// refused (overloaded) before they outgrow the memory limit, rather than counted
// nowhere until the OOM killer ends every call in flight.
//
// The figures are RSS, measured by test/conformance TestConnectionCosts on the
// build an operator runs (which fails when one is passed), rounded up: goroutine
// stacks, buffers, TLS and HTTP/2 state, and the collector's headroom over them.
const (
	// ConnCost is an accepted connection: its goroutine, read and write buffers,
	// a request head being read within its read buffer.
	ConnCost int64 = 12 << 10
	// TunnelCost is what a tunnel adds: for one egressd intercepts, the TLS
	// handshake and record state and the inner connection's buffers, or the
	// HTTP/2 server's state, frame buffers and goroutines (the larger of the two);
	// for a spliced one, the upstream connection and the two copying goroutines.
	TunnelCost int64 = 80 << 10
	// RequestCost is what a request being forwarded adds: the upstream connection
	// it holds (its TLS, buffers and goroutines) and the body being streamed. A
	// request whose body never comes holds it as long as its client wants.
	RequestCost int64 = 112 << 10
)

// OverflowBytes bounds what the connections a listener holds beyond
// limits.max_connections or the budget (being admitted to the hook lane, in it,
// cut and lingering) may cost, apart from the budget: they are counted at
// ConnCost+TunnelCost each (OverflowConns), so that no flood of fake hook calls
// can take the memory the budget leaves to everything else.
const OverflowBytes int64 = 32 << 20

// OverflowConns is how many connections OverflowBytes holds.
func OverflowConns() int64 { return OverflowBytes / (ConnCost + TunnelCost) }

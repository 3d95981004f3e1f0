package membudget

import (
	"fmt"

	"github.com/docker/go-units"
)

// What egressd holds outside the budget, for Shortfalls: estimates, kept on the
// generous side of what make bench-idle and the conformance memory cases show.
const (
	// PerConnection is an open client connection's cost beyond the budget: its
	// goroutine, read and write buffers and state (one with a request in
	// flight holds more, but briefly).
	PerConnection int64 = 16 << 10
	// Baseline is egressd's idle footprint: the runtime, the leaf cache, the
	// policy, the upstream pools.
	Baseline int64 = 24 << 20
)

// Shortfall is one way a config's limits cannot fit a memory limit: the key to
// change and why.
type Shortfall struct {
	Key, Msg string
}

// Demand is what a config's limits let clients make egressd hold.
type Demand struct {
	Budget      int64 // limits.memory, resolved
	Listeners   int   // sandbox listeners, each with its own limits.max_connections
	MaxConns    int   // limits.max_connections
	HookBuffer  int64 // limits.hook_buffer_bytes
	HookBodyMax int64 // limits.hook_body_bytes
}

// Shortfalls names every way d cannot fit a memory limit of limit bytes (from
// names where it was read: "cgroup" or "GOMEMLIMIT"); none when it fits.
func (d Demand) Shortfalls(limit int64, from string) []Shortfall {
	var out []Shortfall
	seen := fmt.Sprintf("the memory limit egressd can see (%s, %s)", size(limit), from)
	if d.Budget+Baseline > limit {
		out = append(out, Shortfall{"limits.memory", fmt.Sprintf(
			"the memory budget (%s) and egressd's idle footprint (about %s) exceed %s: a flood could get egressd OOM-killed; use auto, or at most %s",
			size(d.Budget), size(Baseline), seen, size(max(limit-Baseline, 0)))})
	} else if conns := int64(d.Listeners) * int64(d.MaxConns); Baseline+d.Budget+conns*PerConnection > limit {
		fit := (limit - Baseline - d.Budget) / PerConnection / int64(max(d.Listeners, 1))
		out = append(out, Shortfall{"limits.max_connections", fmt.Sprintf(
			"%d connections (%d listeners x %d) cost about %s beyond the memory budget (%s); with it and egressd's idle footprint they exceed %s: lower limits.max_connections to %d, or raise the limit",
			conns, d.Listeners, d.MaxConns, size(conns*PerConnection), size(d.Budget), seen, fit)})
	}
	if share := HookShare(d.Budget, d.HookBuffer, d.HookBodyMax); share < d.HookBuffer {
		out = append(out, Shortfall{"limits.hook_buffer_bytes", fmt.Sprintf(
			"%s is more than half the memory budget (%s): hook bodies get %s",
			size(d.HookBuffer), size(d.Budget), size(share))})
	}
	return out
}

// HookShare is hook bodies' standing share of a budget of budget bytes:
// limits.hook_buffer_bytes (hookBuffer), at most half the budget, but always one
// hook body of limits.hook_body_bytes (hookBody).
func HookShare(budget, hookBuffer, hookBody int64) int64 {
	return min(hookBuffer, max(budget/2, hookBody))
}

func size(n int64) string { return units.BytesSize(float64(n)) }

package membudget

import (
	"fmt"

	"github.com/docker/go-units"
)

// Baseline is egressd's idle footprint, outside the budget, for Shortfalls: the
// runtime, the leaf cache, the policy, the upstream pools (kept on the generous
// side of what an idle egressd measures).
const Baseline int64 = 24 << 20

// Shortfall is one way a config's limits cannot fit a memory limit: the key to
// change and why.
type Shortfall struct {
	Key, Msg string
}

// Demand is what a config's limits let clients make egressd hold.
type Demand struct {
	Budget      int64 // limits.memory, resolved
	Listeners   int   // listeners, each with its own overflow (OverflowBytes)
	HookBuffer  int64 // limits.hook_buffer_bytes
	HookBodyMax int64 // limits.hook_body_bytes
}

// Shortfalls names every way d cannot fit a memory limit of limit bytes (from
// names where it was read: "cgroup" or "GOMEMLIMIT"); none when it fits.
func (d Demand) Shortfalls(limit int64, from string) []Shortfall {
	var out []Shortfall
	seen := fmt.Sprintf("the memory limit egressd can see (%s, %s)", size(limit), from)
	if outside := Baseline + int64(d.Listeners)*OverflowBytes; d.Budget+outside > limit {
		out = append(out, Shortfall{"limits.memory", fmt.Sprintf(
			"the memory budget (%s), egressd's idle footprint (about %s) and what connections beyond limits.max_connections may hold (%s on each of %d listeners) exceed %s: a flood could get egressd OOM-killed; use auto, or at most %s",
			size(d.Budget), size(Baseline), size(OverflowBytes), d.Listeners, seen, size(max(limit-outside, 0)))})
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

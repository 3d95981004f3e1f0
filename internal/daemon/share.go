package daemon

import (
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/proxy"
)

// Node mode's budgets are the node's: its limits.memory, limits.hook_buffer_bytes
// and limits.max_connections bound what every sandbox holds together, and each
// sandbox draws on them through a share (proxy.NewShare), as a cgroup's charge goes
// up its hierarchy: a reservation is refused when either the share or the node's
// total is spent. A flood from one sandbox therefore spends its own share, never
// the node's total nor another's slots (docs/node.md, "Shares of the node's
// budgets").

// defaultShareDiv: a sandbox whose spec is silent on a limit gets this fraction of
// the node's. A quarter lets a busy sandbox use far more than an even split while
// no one sandbox, flooding, can spend more than a quarter of the node.
const defaultShareDiv = 4

// shareLimits makes snap's limits.memory, limits.hook_buffer_bytes and
// limits.max_connections (per listener) the sandbox's share of node's: what its
// spec asks (want), at most the node's, or defaultShareDiv of the node's when the
// spec is silent.
func shareLimits(snap *proxy.Snapshot, node *proxy.Server, want config.Share) {
	nl := node.Snapshot().Limits
	budget := node.Budget().Limit()
	snap.Limits.Memory = max(shareOf(want.Memory, budget), min(budget, membudget.MinAuto))
	snap.Limits.HookBufferBytes = max(shareOf(want.HookBufferBytes, nl.HookBufferBytes), min(nl.HookBufferBytes, snap.Limits.HookBodyBytes))
	snap.Limits.MaxConnections = int(shareOf(int64(want.MaxConnections), int64(nl.MaxConnections)))
}

// shareOf is a share of node: want, at most node, or node/defaultShareDiv (at
// least 1) when want is 0.
func shareOf(want, node int64) int64 {
	if want > 0 {
		return min(want, node)
	}
	return max(node/defaultShareDiv, 1)
}

// shareMemory is GET /v1/sandboxes/{id}'s "memory": what the sandbox holds of
// its share, by holder, and how many reservations the share refused.
type shareMemory struct {
	Limit   int64            `json:"limit_bytes"`
	Used    int64            `json:"used_bytes"`
	Holders map[string]int64 `json:"holders"`
	Refused int64            `json:"refused"`
}

func shareStatus(srv *proxy.Server) shareMemory {
	b := srv.Budget()
	out := shareMemory{Limit: b.Limit(), Used: b.Used(), Holders: map[string]int64{}, Refused: b.Refused()}
	for _, h := range membudget.Holders() {
		out.Holders[h.String()] = b.Held(h)
	}
	out.Holders[membudget.HookBodies.String()] = srv.HookBuffered()
	out.Used += srv.HookBuffered() - b.Held(membudget.HookBodies)
	return out
}

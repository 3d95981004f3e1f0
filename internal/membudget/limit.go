package membudget

import (
	"errors"
	"math"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// Where a budget's size, or GOMEMLIMIT, came from (the "from" of the start line).
const (
	FromConfig     = "limits.memory" // an explicit size
	FromCgroup     = "cgroup"        // the cgroup's memory limit
	FromGOMEMLIMIT = "GOMEMLIMIT"    // the environment's GOMEMLIMIT
	FromDefault    = "default"       // no limit visible: DefaultBytes
)

const (
	// autoDivisor: limits.memory auto is a quarter of the memory limit egressd
	// can see. The rest is egressd's idle footprint (runtime, caches, the leaf
	// cache), what each open connection costs outside the budget (its goroutine
	// and small buffers), and the collector's headroom: garbage waits for the next
	// collection, and GOMEMLIMIT only makes collections come sooner.
	autoDivisor = 4
	// DefaultBytes is the budget when no memory limit is visible: egressd runs
	// unconfined, and this only bounds what one client can make it hold.
	DefaultBytes int64 = 256 << 20
	// MinAuto is the smallest budget auto gives, whatever the limit: one hook body
	// of the default limits.hook_body_bytes must fit in the hook share (half).
	MinAuto int64 = 8 << 20
	// goMemLimitRatio is GOMEMLIMIT's share of the cgroup's limit when egressd
	// sets it: the collector works harder as the heap nears it, and the rest is
	// left to what the Go runtime does not count (stacks' OS overhead, the
	// kernel's page cache charged to the cgroup).
	goMemLimitRatio = 0.9
)

// cgroupLimit reads the cgroup memory limit (v2 memory.max, v1
// memory.limit_in_bytes; the smallest on the path from the root); tests replace it.
var cgroupLimit = memlimit.FromCgroup

// MemoryLimit is the memory limit egressd can see and where it comes from: its
// cgroup's, else GOMEMLIMIT when the environment sets it, else 0 and "".
func MemoryLimit() (int64, string) {
	if n, err := cgroupLimit(); err == nil && n > 0 && n < math.MaxInt64 {
		return int64(n), FromCgroup
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		if n := debug.SetMemoryLimit(-1); n > 0 && n < math.MaxInt64 {
			return n, FromGOMEMLIMIT
		}
	}
	return 0, ""
}

// Resolve is the budget's size for limits.memory (configured; 0 means auto) and
// where it comes from: the configured size, else a quarter of MemoryLimit (at
// least MinAuto), else DefaultBytes.
func Resolve(configured int64) (int64, string) {
	if configured > 0 {
		return configured, FromConfig
	}
	limit, from := MemoryLimit()
	if from == "" {
		return DefaultBytes, FromDefault
	}
	return max(limit/autoDivisor, MinAuto), from
}

// SetGoMemLimit sets GOMEMLIMIT to 90% of the cgroup's memory limit when the
// environment sets no GOMEMLIMIT (AUTOMEMLIMIT=off, or a ratio, is honoured as
// automemlimit documents), and returns the limit in force and where it came from
// ("" when there is none).
func SetGoMemLimit() (int64, string) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1), FromGOMEMLIMIT
	}
	n, err := memlimit.Set(memlimit.WithRatio(goMemLimitRatio), memlimit.WithProvider(func() (uint64, error) {
		return cgroupLimit()
	}))
	if err != nil && !errors.Is(err, memlimit.ErrNoLimit) || n <= 0 || n == math.MaxInt64 {
		return 0, ""
	}
	return n, FromCgroup
}

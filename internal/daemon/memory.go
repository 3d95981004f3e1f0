package daemon

import (
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/membudget"
)

// setMemoryLimits sets GOMEMLIMIT from the cgroup's memory limit when the
// environment sets none, and logs it with the memory budget limits.memory gives
// (docs/configuration.md, limits.memory): the two numbers an operator needs to
// see why a flood is refused overloaded rather than OOM-killed.
func (d *Daemon) setMemoryLimits(l config.Limits) {
	goLimit, goFrom := membudget.SetGoMemLimit()
	budget, from := membudget.Resolve(l.Memory)
	ev := d.log.Info().Int64("memory_budget_bytes", budget).Str("memory_budget_from", from)
	if goFrom != "" {
		ev = ev.Int64("gomemlimit_bytes", goLimit).Str("gomemlimit_from", goFrom)
	}
	ev.Msg("memory limits")
}

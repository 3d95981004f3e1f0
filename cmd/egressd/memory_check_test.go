package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/membudget"
)

// TestCheckWarnsWhenLimitsCannotFitMemory: with a memory limit check can see (here
// GOMEMLIMIT, 100 MiB), limits that let clients make egressd hold more than it
// (a budget that leaves no room for egressd's own footprint and the connections
// beyond a listener's bound) are a warning naming the key and the size that fits,
// as is a hook buffer the budget caps; limits that fit are not, whatever
// limits.max_connections (every connection draws on the budget).
func TestCheckWarnsWhenLimitsCannotFitMemory(t *testing.T) {
	if _, from := membudget.MemoryLimit(); from == membudget.FromCgroup {
		t.Skip("this test's cgroup has a memory limit, which check would read before GOMEMLIMIT")
	}
	t.Setenv("GOMEMLIMIT", "100MiB")
	for _, tc := range []struct {
		name, limits, want string
	}{
		{"a hook buffer past half the budget", "limits: {max_connections: 100}\n", "warning: limits.hook_buffer_bytes: 32MiB is more than half the memory budget (25MiB): hook bodies get 12.5MiB"},
		{"a budget past the limit", "limits: {memory: 50MiB}\n", "warning: limits.memory: the memory budget (50MiB), egressd's idle footprint (about 24MiB) and what connections beyond limits.max_connections may hold (32MiB on each of 1 listeners) exceed the memory limit egressd can see (100MiB, GOMEMLIMIT): a flood could get egressd OOM-killed; use auto, or at most 44MiB"},
		{"limits that fit", "limits: {max_connections: 100000, hook_buffer_bytes: 8388608}\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFiles(t, map[string]string{"egressd.yaml": minimalConfig + tc.limits, "credentials.json": `{}`,
				"environment.json": `{"network": {"allowlist": [{"domain": "example.com"}]}}`})
			res := egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml"))
			if res.code != 0 {
				t.Fatalf("check: %s, want exit 0 (warnings only)", res)
			}
			if tc.want == "" && strings.Contains(res.stdout, "memory") {
				t.Errorf("limits that fit: %s, want no memory warning", res)
			}
			if !strings.Contains(res.stdout, tc.want) {
				t.Errorf("check lacks %q\n%s", tc.want, res)
			}
		})
	}
}

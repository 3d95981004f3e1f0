package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/membudget"
)

// TestCheckWarnsWhenLimitsCannotFitMemory: with a memory limit check can see (here
// GOMEMLIMIT, 100 MiB), limits that let clients make egressd hold more than it
// (10,000 connections beside the budget) are a warning naming the key and the
// number that fits, as is a hook buffer the budget caps; limits that fit are not.
func TestCheckWarnsWhenLimitsCannotFitMemory(t *testing.T) {
	if _, from := membudget.MemoryLimit(); from == membudget.FromCgroup {
		t.Skip("this test's cgroup has a memory limit, which check would read before GOMEMLIMIT")
	}
	t.Setenv("GOMEMLIMIT", "100MiB")
	for _, tc := range []struct {
		name, limits, want string
	}{
		{"a hook buffer past half the budget", "limits: {max_connections: 100}\n", "warning: limits.hook_buffer_bytes: 32MiB is more than half the memory budget (25MiB): hook bodies get 12.5MiB"},
		{"default connections", "", "warning: limits.max_connections: 10000 connections (1 listeners x 10000) cost about 156.2MiB beyond the memory budget (25MiB); with it and egressd's idle footprint they exceed the memory limit egressd can see (100MiB, GOMEMLIMIT): lower limits.max_connections to 3264, or raise the limit"},
		{"a budget past the limit", "limits: {memory: 96MiB, max_connections: 100}\n", "warning: limits.memory: the memory budget (96MiB) and egressd's idle footprint (about 24MiB) exceed the memory limit egressd can see (100MiB, GOMEMLIMIT)"},
		{"limits that fit", "limits: {max_connections: 1000, hook_buffer_bytes: 8388608}\n", ""},
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

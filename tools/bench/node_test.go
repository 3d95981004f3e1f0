package main

import (
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/config"
)

// Every spec the node rows register is one egressd's validator accepts, on a
// loopback address of its own; a variant changes the spec but not what the
// probe's requests are allowed.
func TestNodeSpec(t *testing.T) {
	up := testUpstream()
	up.hook = &hookServer{addr: "127.0.0.1:1444"} // as when the hook path runs
	cfg, files := nodeConfig(up, "127.0.0.1:5353")
	if cfg.Hooks != nil { // the bench's pre-tool hook would make every spec need hooks.identify
		t.Errorf("the node config has the hook path's hooks: %+v", cfg.Hooks)
	}
	node, _ := loadConfig(t, cfg, files)
	seen := map[string]bool{}
	for _, i := range []int{0, 1, 249, 250, nodeSandboxes + nodeAPIOps + 31} {
		for variant := range 3 {
			spec := nodeSpec(up, i, variant)
			sb, err := config.ParseSandbox(node, "sbx-1", []byte(spec), "")
			if err != nil {
				t.Fatalf("sandbox %d variant %d: %v\n%s", i, variant, err, spec)
			}
			addr := sb.Config.Listeners[0].Address
			if !addr.Addr().IsLoopback() || seen[sb.Hash] || variant == 0 && seen[addr.String()] {
				t.Errorf("sandbox %d variant %d: address %s, hash or address seen before", i, variant, addr)
			}
			seen[sb.Hash], seen[addr.String()] = true, true
			if !strings.Contains(spec, `"credential": "`+credentialID+`"`) {
				t.Errorf("sandbox %d: the credential entry is missing:\n%s", i, spec)
			}
		}
	}
}

// The node lines hold each figure to its goal.
func TestWriteNode(t *testing.T) {
	sum := &nodeSummary{Sandboxes: nodeSandboxes, EmptyRSSBytes: 20 << 20, FullRSSBytes: 70 << 20, SidecarRSSBytes: 20 << 20,
		API: map[string]runResult{"register": {P50US: 1000, P99US: 60000}}, ChurnOps: 100, ChurnSeconds: 2}
	r := &report{Paths: []pathResult{
		{Path: "node-1", Node: sum, CPUPerReqUS: 100, Egressd: runResult{ReqPerSec: 1}},
		{Path: "node-1000", CPUPerReqUS: 104, Egressd: runResult{ReqPerSec: 1}},
		{Path: "node-quiet", Egressd: runResult{P99US: 1000}},
		{Path: "node-churn", Egressd: runResult{P99US: 2500}},
	}}
	var b strings.Builder
	r.writeNode(&b)
	for _, want := range []string{
		"50.0 MiB over empty, 51.2 KiB each (goal ≤ 64.0 MiB, ≤ 64.0 KiB each: met); one sidecar egressd 20.0 MiB, so 1,000 sidecars ~19.5 GiB",
		"register p50/p99 1.00ms/60.0ms, ", "goal p99 ≤ 50ms: NOT met",
		"100 operations in 2.0s (50.0/s), 0 failed; the probe's p99 2.50ms vs 1.00ms quiet: +1500µs (goal ≤ 1000µs added: NOT met)",
		"104.0 µs with 1,000 sandboxes vs 100.0 with 1: +4.0% (goal within 5%: met)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("node lines lack %q:\n%s", want, b.String())
		}
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

// The node rows: egressd's node mode (docs/node.md), one egressd serving many
// sandboxes registered through its API socket. Each sandbox's proxy listener is
// on a gateway-side loopback address of its own (127.77.x.y, no network
// namespace). Two nodes run side by side: one serving one sandbox, one serving
// nodeSandboxes, so that the CPU per request of the same path through each
// alternates within every round.
const (
	nodePathName  = "node"
	nodeSandboxes = 1000
	nodeAPIOps    = 100 // register, change and remove cycles timed for the API row
	nodeChurnRate = 50  // churn operations per second during the churn row
	nodeHold      = 2 * time.Second
	nodeSocket    = "run/node.sock"
	nodeProbe     = "probe" // the sandbox the load goes through
	// The goals the rows are held to.
	nodeGoalBytes     = 64 << 20
	nodeGoalEachBytes = 64 << 10
	nodeGoalAPI       = 50 * time.Millisecond
	nodeGoalChurnUS   = 1000
	nodeGoalCPU       = 0.05
	// nodeLatencyClients: the churn rows measure latency, not throughput, so
	// their load leaves the CPUs room.
	nodeLatencyClients = 1
)

// nodeSummary is what the node rows found beside their table rows.
type nodeSummary struct {
	Sandboxes       int                  `json:"sandboxes"`
	EmptyRSSBytes   int64                `json:"empty_rss_bytes"`
	FullRSSBytes    int64                `json:"full_rss_bytes"`
	SidecarRSSBytes int64                `json:"sidecar_rss_bytes"`
	API             map[string]runResult `json:"api"` // latencies by operation
	ChurnOps        int64                `json:"churn_ops"`
	ChurnErrors     int64                `json:"churn_errors"`
	ChurnSeconds    float64              `json:"churn_s"`
	RegisterAllSecs float64              `json:"register_all_s"`
	IdleCPU         float64              `json:"idle_cpu"` // the full node's CPU-seconds per second with no traffic
}

func nodePathSpec() pathSpec {
	return pathSpec{name: nodePathName, inject: injectCredential, measure: measureNode,
		desc: fmt.Sprintf("node mode: %d sandboxes registered through the API socket, each with a proxy listener on 127.77.x.y; the credential path's GETs through one sandbox of a node with 1 and of a node with %d (CPU per request), its latency with and without %d registrations, changes and removals a second, the API's latencies and the node's RSS", nodeSandboxes, nodeSandboxes, nodeChurnRate)}
}

// nodeEgressd is a node egressd and a client of its API socket.
type nodeEgressd struct {
	*egressd
	api *egressdtest.NodeAPI
}

// nodeConfig is benchConfig's but for its listeners, policy and hooks: a node's
// sandboxes bring their own.
func nodeConfig(up *upstream, dnsAddr string) (*egressdtest.Config, map[string]string) {
	cfg, files := benchConfig(up, dnsAddr, nil, benchMaxConnections)
	cfg.Listeners, cfg.Policy, cfg.Hooks = nil, egressdtest.Policy{}, nil
	cfg.Node = &egressdtest.Node{APISocket: nodeSocket, MaxSandboxes: 2 * nodeSandboxes}
	return cfg, files
}

func startNode(ctx context.Context, env pathEnv, name string) (*nodeEgressd, error) {
	cfg, files := nodeConfig(env.w.up, env.dns.Addr)
	dir := filepath.Join(env.dir, name)
	e, err := startEgressd(ctx, env.o.egressd, dir, cfg, files)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &nodeEgressd{egressd: e, api: egressdtest.NewNodeAPI(filepath.Join(dir, nodeSocket))}, nil
}

// nodeSpec is sandbox i's spec: a proxy listener on its own loopback address and
// the credential path's entry; variant changes it without changing what it allows.
func nodeSpec(up *upstream, i, variant int) string {
	addr := fmt.Sprintf("127.77.%d.%d:0", i/250, i%250+1)
	extra := ""
	if variant > 0 {
		extra = fmt.Sprintf(`, {"domain": "v%d.%s", "ports": [%d]}`, variant, benchZone, portNum(up.tlsAddr))
	}
	return fmt.Sprintf(`{"listeners": [{"name": "sbx", "address": %q, "mode": "proxy"}],
 "environment": {"network": {"allowlist": [{"domain": %q, "ports": [%d], "credential": %q}%s]}}}`,
		addr, credentialHost, portNum(up.tlsAddr), credentialID, extra)
}

// call makes one API request and returns its body and how long it took; want
// is the status it must answer.
func (n *nodeEgressd) call(method, id, body string, want ...int) ([]byte, time.Duration, error) {
	t0 := time.Now()
	code, b, err := n.api.Do(method, id, body)
	took := time.Since(t0)
	if err == nil && !slices.Contains(want, code) {
		err = fmt.Errorf("%s %s: %d: %s", method, id, code, truncate(string(b), 300))
	}
	return b, took, err
}

// apiOps are the API operations timed and churned, in the order a sandbox
// goes through them (apiOp).
var apiOps = []string{"register", "change", "remove"}

// apiOp makes apiOps[k] on sandbox id: registers it with spec i, changes it
// (without changing what it allows), or removes it.
func (n *nodeEgressd) apiOp(k int, up *upstream, id string, i int) (time.Duration, error) {
	if apiOps[k] == "remove" {
		_, took, err := n.call(http.MethodDelete, id, "", http.StatusNoContent)
		return took, err
	}
	return n.register(up, id, i, k) // the change is variant 1
}

// register puts sandbox id with spec i in force.
func (n *nodeEgressd) register(up *upstream, id string, i, variant int) (time.Duration, error) {
	_, took, err := n.call(http.MethodPut, id, nodeSpec(up, i, variant), http.StatusCreated, http.StatusOK)
	return took, err
}

// measureNode runs the node rows: memory and API times while filling the large
// node, then CPU per request on both nodes, then latency with and without churn.
func measureNode(ctx context.Context, env pathEnv) ([]pathResult, error) {
	sum := &nodeSummary{Sandboxes: nodeSandboxes, API: map[string]runResult{}}
	one, err := startNode(ctx, env, "node-1")
	if err != nil {
		return nil, err
	}
	defer one.stop()
	many, err := startNode(ctx, env, "node-many")
	if err != nil {
		return nil, err
	}
	defer many.stop()
	if sum.SidecarRSSBytes, err = sidecarRSS(ctx, env); err != nil {
		return nil, err
	}
	if err := fillNode(ctx, env.w.up, many, sum); err != nil {
		return nil, err
	}
	if _, err := one.register(env.w.up, nodeProbe, 0, 0); err != nil {
		return nil, err
	}
	if err := timeAPI(env.w.up, many, sum); err != nil {
		return nil, err
	}
	rows, err := nodeRows(ctx, env, one, many, sum)
	if err != nil {
		return nil, err
	}
	rows[0].Node = sum
	return rows, nil
}

// fillNode reads the empty node's RSS, registers the probe and the other
// sandboxes, and reads the RSS again.
func fillNode(ctx context.Context, up *upstream, n *nodeEgressd, sum *nodeSummary) error {
	pid := n.ServingPid()
	if err := sleepUntil(ctx, time.Now().Add(nodeHold)); err != nil {
		return err
	}
	var err error
	if sum.EmptyRSSBytes, err = procfs.RSS(pid); err != nil {
		return err
	}
	t0 := time.Now()
	var reg runResult
	for i := range nodeSandboxes {
		id := fmt.Sprintf("sbx-%d", i)
		if i == 0 {
			id = nodeProbe
		}
		took, err := n.register(up, id, i, 0)
		if err != nil {
			return fmt.Errorf("registering %d of %d sandboxes: %w", i, nodeSandboxes, err)
		}
		reg.hist.Record(took)
	}
	sum.RegisterAllSecs = time.Since(t0).Seconds()
	reg.window(sum.RegisterAllSecs)
	sum.API["register (filling)"] = reg
	if err := sleepUntil(ctx, time.Now().Add(nodeHold)); err != nil {
		return err
	}
	if sum.FullRSSBytes, err = procfs.RSS(pid); err != nil {
		return err
	}
	used, err := sampleCPU(ctx, n.cpuTime, time.Now(), time.Now().Add(nodeHold))
	sum.IdleCPU = used.Seconds() / nodeHold.Seconds()
	return err
}

// sidecarRSS is the VmRSS of a sidecar egressd serving what one sandbox's spec
// says, idle after its start, as the node's sandboxes are when measured.
func sidecarRSS(ctx context.Context, env pathEnv) (int64, error) {
	cfg, files := benchConfig(env.w.up, env.dns.Addr, nil, benchMaxConnections)
	cfg.Policy.Allowlist = cfg.Policy.Allowlist[2:3] // the credential entry
	e, err := startEgressd(ctx, env.o.egressd, filepath.Join(env.dir, "node-sidecar"), cfg, files)
	if err != nil {
		return 0, fmt.Errorf("sidecar: %w", err)
	}
	defer e.stop()
	if err := sleepUntil(ctx, time.Now().Add(nodeHold)); err != nil {
		return 0, err
	}
	return procfs.RSS(e.ServingPid())
}

// timeAPI times nodeAPIOps cycles of registering, changing and removing a
// sandbox on the full node.
func timeAPI(up *upstream, n *nodeEgressd, sum *nodeSummary) error {
	runs := make([]runResult, len(apiOps))
	for i := range nodeAPIOps {
		for j := range apiOps {
			took, err := n.apiOp(j, up, fmt.Sprintf("api-%d", i), nodeSandboxes+i)
			if err != nil {
				return err
			}
			runs[j].hist.Record(took)
		}
	}
	for j, op := range apiOps {
		runs[j].window(1)
		sum.API[op] = runs[j]
	}
	return nil
}

// nodeRows measures the node rows in two pairs, each pair after the same direct
// runs: through the probe sandbox of the node with one sandbox and of the full
// one (CPU per request), then, with nodeLatencyClients, through the full one's
// probe without and with churn (latency).
func nodeRows(ctx context.Context, env pathEnv, one, many *nodeEgressd, sum *nodeSummary) ([]pathResult, error) {
	w1, err := one.probeWorld(env.w)
	if err != nil {
		return nil, err
	}
	wm, err := many.probeWorld(env.w)
	if err != nil {
		return nil, err
	}
	lo, slow := env.o.load(), env.o.load()
	slow.clients = nodeLatencyClients
	through := func(n *nodeEgressd, w *world, lo loadOptions, name, desc string) *row {
		return egressdRow(ctx, env, nodePath, w, n.egressd, lo, newRow(name, desc, injectCredential.String()))
	}
	churning := through(many, wm, slow, "node-churn", fmt.Sprintf("as node-quiet, while other sandboxes are registered, changed and removed, %d a second", nodeChurnRate))
	churning.run = whileRunning(churning.run, func(ctx context.Context) { churn(ctx, env.w.up, many, sum) })
	var rows []pathResult
	for i, rs := range [][]*row{{
		through(one, w1, lo, "node-1", "the credential path through the only sandbox of a node"),
		through(many, wm, lo, fmt.Sprintf("node-%d", nodeSandboxes), fmt.Sprintf("the credential path through one sandbox of a node serving %d", nodeSandboxes)),
	}, {
		through(many, wm, slow, "node-quiet", fmt.Sprintf("the probe sandbox's GETs, %d client(s), nothing else changing", nodeLatencyClients)),
		churning,
	}} {
		direct := func(int) (runResult, error) {
			return runCounted(ctx, nodePath.direct(env.w), []loadOptions{lo, slow}[i], env.w.up, nil)
		}
		if err := runRounds(env, direct, rs, nil); err != nil {
			return nil, err
		}
		rows = append(rows, finishAll(rs)...)
	}
	return rows, nil
}

// nodePath is what the node rows send: the credential path's GETs.
var nodePath = interceptPath("", credentialHost, injectCredential, peersNone, target{}, "")

// probeWorld is w through the probe sandbox's listener, whose address GET
// /v1/sandboxes/probe tells.
func (n *nodeEgressd) probeWorld(w *world) (*world, error) {
	var info struct{ Listeners map[string]string }
	b, _, err := n.call(http.MethodGet, nodeProbe, "", http.StatusOK)
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	addr := info.Listeners["sbx"]
	if err == nil && loopbackOnly(addr) != nil {
		err = fmt.Errorf("the probe sandbox's listener is %q", addr)
	}
	if err != nil {
		return nil, err
	}
	return w.through(n.egressd, "http://"+addr)
}

// whileRunning is run with during running beside it, until run returns.
func whileRunning(run func(cpuFunc) (runResult, error), during func(context.Context)) func(cpuFunc) (runResult, error) {
	return func(cpu cpuFunc) (runResult, error) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); during(ctx) }()
		defer func() { cancel(); <-done }()
		return run(cpu)
	}
}

// churn registers, changes and removes sandboxes at nodeChurnRate until ctx ends.
func churn(ctx context.Context, up *upstream, n *nodeEgressd, sum *nodeSummary) {
	tick, t0 := time.NewTicker(time.Second/nodeChurnRate), time.Now()
	defer func() { tick.Stop(); sum.ChurnSeconds += time.Since(t0).Seconds() }()
	var i int
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		k := i / len(apiOps) % 32
		_, err := n.apiOp(i%len(apiOps), up, fmt.Sprintf("churn-%d", k), nodeSandboxes+nodeAPIOps+k)
		i++
		sum.ChurnOps++
		if err != nil && ctx.Err() == nil {
			sum.ChurnErrors++
		}
	}
}

// writeNode prints the node rows' figures against their goals.
func (r *report) writeNode(w io.Writer) {
	p := r.path("node-1")
	if p == nil || p.Node == nil {
		return
	}
	s, many := p.Node, r.path(fmt.Sprintf("node-%d", p.Node.Sandboxes))
	over := s.FullRSSBytes - s.EmptyRSSBytes
	each := float64(over) / float64(s.Sandboxes)
	fmt.Fprintf(w, "\nnode (%s sandboxes, listeners on 127.77.x.y in egressd's own network namespace):\n", thousands(float64(s.Sandboxes)))
	fmt.Fprintf(w, "  memory: empty node %s, with %s sandboxes %s: %s over empty, %s each (goal ≤ %s, ≤ %s each: %s); one sidecar egressd %s, so %s sidecars ~%.1f GiB\n",
		mib(s.EmptyRSSBytes), thousands(float64(s.Sandboxes)), mib(s.FullRSSBytes), mib(over), kib(each), mib(nodeGoalBytes), kib(nodeGoalEachBytes),
		verdict(over <= nodeGoalBytes && each <= nodeGoalEachBytes), mib(s.SidecarRSSBytes), thousands(float64(s.Sandboxes)), float64(s.SidecarRSSBytes)*float64(s.Sandboxes)/(1<<30))
	fmt.Fprintf(w, "  API (%d cycles on the full node; filling took %.1fs): ", nodeAPIOps, s.RegisterAllSecs)
	worst := 0.0
	for _, op := range []string{"register (filling)", "register", "change", "remove"} {
		x := s.API[op]
		worst = max(worst, x.P99US)
		fmt.Fprintf(w, "%s p50/p99 %s, ", op, latencies(x))
	}
	fmt.Fprintf(w, "goal p99 ≤ %s: %s\n", nodeGoalAPI, verdict(worst <= micros(nodeGoalAPI)))
	if q, c := r.path("node-quiet"), r.path("node-churn"); q != nil && c != nil {
		added := c.Egressd.P99US - q.Egressd.P99US
		fmt.Fprintf(w, "  churn: %d operations in %.1fs (%.1f/s), %d failed; the probe's p99 %s vs %s quiet: %+.0fµs (goal ≤ %dµs added: %s)\n",
			s.ChurnOps, s.ChurnSeconds, float64(s.ChurnOps)/max(s.ChurnSeconds, 1e-9), s.ChurnErrors,
			dur(c.Egressd.P99US), dur(q.Egressd.P99US), added, nodeGoalChurnUS, verdict(added <= nodeGoalChurnUS && s.ChurnErrors == 0))
	}
	if many != nil && p.CPUPerReqUS > 0 && many.CPUPerReqUS > 0 {
		d := many.CPUPerReqUS/p.CPUPerReqUS - 1
		fmt.Fprintf(w, "  CPU per request: %.1f µs with %s sandboxes vs %.1f with 1: %+.1f%% (goal within %.0f%%: %s); the full node idle: %.0f%% of a CPU\n",
			many.CPUPerReqUS, thousands(float64(s.Sandboxes)), p.CPUPerReqUS, 100*d, 100*nodeGoalCPU, verdict(d <= nodeGoalCPU), 100*s.IdleCPU)
	}
}

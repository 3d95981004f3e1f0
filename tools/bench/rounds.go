package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
)

// pathEnv is what measuring a path gets: the world and egressd its runs go
// through, the DNS stub, the options, the run's temp dir and where progress goes.
type pathEnv struct {
	w      *world
	e      *egressd
	dns    *dnsstub.Server
	o      options
	dir    string
	stderr io.Writer
}

// viaRun is one run through a proxy and, through egressd, what egressd did
// meanwhile.
type viaRun struct {
	r       runResult
	log     logSummary
	leaf    leafCounts
	leafErr error
	dns     int64
}

// measureVia runs load through e (load gets e's CPU sampler) and collects the
// log lines egressd wrote, how its leaf cache grew and the DNS stub's queries.
func measureVia(e *egressd, dns *dnsstub.Server, load func(cpuFunc) (runResult, error)) (viaRun, error) {
	var v viaRun
	leafBefore, leafErr := e.leafCache()
	dnsBefore, from := int64(dns.Total()), e.LogSize()
	r, err := load(e.cpuTime)
	if err != nil {
		return v, err
	}
	v.r, v.dns = r, int64(dns.Total())-dnsBefore
	if v.log, err = e.scanLog(from); err != nil {
		return v, fmt.Errorf("egressd log: %w", err)
	}
	leafAfter, err := e.leafCache()
	v.leaf, v.leafErr = leafCounts{leafAfter.Hit - leafBefore.Hit, leafAfter.Miss - leafBefore.Miss}, cmp.Or(leafErr, err)
	return v, nil
}

// row is one row of the report being measured: a run through one proxy (an
// egressd or a peer) in each round, after that round's direct run.
type row struct {
	res  pathResult
	leaf leafCounts // its growth over the runs through an egressd
	e    *egressd   // the egressd its runs go through, nil for a peer
	peer *peer      // the peer they go through, nil for an egressd
	// run makes one run, sampling cpu; nil for a row that is not measured (a
	// peer that does not carry the path: res.Skipped says why).
	run func(cpu cpuFunc) (runResult, error)
	// check returns the run's problems; it may adjust x's log first.
	check func(round int, direct runResult, x *viaRun) []string
}

func newRow(name, desc, injects string) *row {
	return &row{res: pathResult{Path: name, Description: desc, Injects: injects}}
}

// once makes one run and, through an egressd, reads what it did meanwhile.
func (r *row) once(env pathEnv) (viaRun, error) {
	if r.e != nil {
		return measureVia(r.e, env.dns, r.run)
	}
	x, err := r.run(r.peer.cpuTime)
	return viaRun{r: x}, err
}

// add records one round: its direct run and its run through the proxy.
func (r *row) add(direct runResult, x viaRun) {
	r.res.Rounds = append(r.res.Rounds, newRound(direct, x.r))
	r.res.Direct.merge(direct)
	r.res.Egressd.merge(x.r)
	r.res.Log.merge(x.log)
	r.res.DNSQueries += x.dns
	r.leaf = leafCounts{r.leaf.Hit + x.leaf.Hit, r.leaf.Miss + x.leaf.Miss}
	if x.leafErr != nil {
		r.res.LeafCacheError = x.leafErr.Error()
	}
}

// finish is the row with its medians and its proxy's peak RSS so far.
func (r *row) finish() pathResult {
	if len(r.res.Rounds) == 0 {
		return r.res
	}
	r.res.finish()
	r.res.Direct.setLatencies()
	r.res.Egressd.setLatencies()
	if r.e != nil && r.res.LeafCacheError == "" {
		r.res.LeafCache = &r.leaf
	}
	if r.e != nil {
		r.res.PeakRSSBytes = r.e.peakRSS()
	} else if r.peer != nil {
		r.res.PeakRSSBytes = r.peer.peakRSS()
	}
	return r.res
}

// runRounds runs env.o.rounds rounds: a direct run, then each row's run, their
// order reversed every other round so that none always runs on the warmer
// egressd, then each of tail (the peers) in order.
func runRounds(env pathEnv, direct func(round int) (runResult, error), rows, tail []*row) error {
	for round := range env.o.rounds {
		d, err := direct(round)
		if err != nil {
			return fmt.Errorf("direct: %w", err)
		}
		order := slices.Clone(rows)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, r := range append(order, tail...) {
			if r.run == nil {
				continue
			}
			x, err := r.once(env)
			if err != nil {
				return fmt.Errorf("through %s: %w", r.res.Path, err)
			}
			if r.check != nil {
				r.res.Problems = append(r.res.Problems, r.check(round, d, &x)...)
			}
			r.add(d, x)
		}
	}
	return nil
}

// finishAll is rows, finished.
func finishAll(rows []*row) []pathResult {
	out := make([]pathResult, len(rows))
	for i, r := range rows {
		out[i] = r.finish()
	}
	return out
}

// measurePath runs a direct/through-egressd path (and its peers after egressd
// in each round, against the same direct run), checking on every run that the
// upstream received exactly what egressd had to inject.
func measurePath(ctx context.Context, env pathEnv, p pathSpec) (pathResult, error) {
	w, lo := env.w, env.o.load()
	injects := p.injects
	if p.inject != injectNone {
		injects = p.inject.String()
	}
	r := egressdRow(ctx, env, p, w, env.e, lo, newRow(p.name, p.desc, injects))
	r.res.NewConnPerRequest = p.direct(w).newConnPerRequest
	peers := w.peers.rows(ctx, p, w, lo)
	direct := func(int) (runResult, error) { return runCounted(ctx, p.direct(w), lo, w.up, nil) }
	if err := runRounds(env, direct, []*row{r}, peers); err != nil {
		return pathResult{}, err
	}
	res := r.finish()
	res.Peers = finishAll(peers)
	return res, nil
}

// egressdRow is r through e: p's viaProxy target on w, what reached the
// upstream checked against what p injects, on every run, and that the
// requests went through e at all (a transparent listener is easy to bypass).
func egressdRow(ctx context.Context, env pathEnv, p pathSpec, w *world, e *egressd, lo loadOptions, r *row) *row {
	r.e = e
	r.run = func(cpu cpuFunc) (runResult, error) { return runCounted(ctx, p.viaProxy(w), lo, w.up, cpu) }
	r.check = func(round int, d runResult, x *viaRun) []string {
		ps := append(injectionProblems(p.inject, round, env.o.rounds, d, x.r), scrubProblems(p, x.r, x.log)...)
		if x.log.EgressLines == 0 {
			ps = append(ps, runLabel("egressd", round, env.o.rounds)+": egressd logged no egress line: the requests did not go through it")
		}
		return ps
	}
	return r
}

// scrubProblems checks that on the credential paths, whose upstream reflects
// the Authorization it receives, egressd scrubbed every response.
func scrubProblems(p pathSpec, via runResult, log logSummary) []string {
	if p.inject != injectCredential && p.inject != injectVaultCredential || log.Scrubbed == via.UpstreamRequests {
		return nil
	}
	return []string{fmt.Sprintf("egressd run: %d of %d responses reflecting the credential were scrubbed", log.Scrubbed, via.UpstreamRequests)}
}

// injectionProblems checks one round's runs against what the path injects: the
// direct run must reach the upstream with nothing injected, the run through
// egressd with every request carrying inj, and nothing else.
func injectionProblems(inj injection, round, rounds int, direct, via runResult) []string {
	var out []string
	label := runLabel("egressd", round, rounds)
	for _, kind := range injections {
		if n := direct.Injected[kind.name]; n > 0 {
			out = append(out, fmt.Sprintf("%s: %d of %d upstream requests carried %s, which only egressd sets", runLabel("direct", round, rounds), n, direct.UpstreamRequests, kind))
		}
		switch n := via.Injected[kind.name]; {
		case kind == inj && (n != via.UpstreamRequests || n == 0):
			out = append(out, fmt.Sprintf("%s: %d of %d upstream requests carried %s as configured", label, n, via.UpstreamRequests, kind))
		case kind != inj && n > 0:
			out = append(out, fmt.Sprintf("%s: %d of %d upstream requests carried %s, which this path's entry does not set", label, n, via.UpstreamRequests, kind))
		}
	}
	slices.Sort(out)
	return out
}

// runLabel names a run in a problem.
func runLabel(run string, round, rounds int) string {
	if rounds > 1 {
		return fmt.Sprintf("%s run, round %d", run, round+1)
	}
	return run + " run"
}

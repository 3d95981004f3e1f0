package main

import (
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
// meanwhile (leaf is nil through a peer).
type viaRun struct {
	r       runResult
	log     logSummary
	leaf    *leafCounts
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
	if leafErr == nil {
		var after leafCounts
		if after, leafErr = e.leafCache(); leafErr == nil {
			v.leaf = &leafCounts{after.Hit - leafBefore.Hit, after.Miss - leafBefore.Miss}
		}
	}
	v.leafErr = leafErr
	return v, nil
}

// rowBuilder gathers the rounds of one row of the report.
type rowBuilder struct {
	res           pathResult
	directs, vias []runResult
	leaf          *leafCounts
}

func newRow(name, desc, injects string) *rowBuilder {
	return &rowBuilder{res: pathResult{Path: name, Description: desc, Injects: injects}}
}

// add records one round: its direct run and its run through the proxy.
func (b *rowBuilder) add(direct runResult, x viaRun) {
	b.res.Rounds = append(b.res.Rounds, newRound(direct, x.r))
	b.directs, b.vias = append(b.directs, direct), append(b.vias, x.r)
	b.res.Log.merge(x.log)
	b.res.DNSQueries += x.dns
	switch {
	case x.leafErr != nil:
		b.res.LeafCacheError = x.leafErr.Error()
	case x.leaf != nil && b.leaf == nil:
		b.leaf = x.leaf
	case x.leaf != nil:
		b.leaf = &leafCounts{b.leaf.Hit + x.leaf.Hit, b.leaf.Miss + x.leaf.Miss}
	}
}

// finish sets the medians and the proxy's peak RSS so far.
func (b *rowBuilder) finish(peak int64) pathResult {
	b.res.Direct, b.res.Egressd = combine(b.directs), combine(b.vias)
	b.res.finish()
	if b.res.LeafCacheError == "" {
		b.res.LeafCache = b.leaf
	}
	b.res.PeakRSSBytes = peak
	return b.res
}

// leg is one row's run through a proxy, egressd or a peer, in each round.
type leg struct {
	row  *rowBuilder
	e    *egressd // the egressd it runs through, nil for a peer
	peer *peer    // the peer it runs through, nil for egressd
	run  func(cpuFunc) (runResult, error)
	// check returns the run's problems; it may adjust x's log first.
	check func(round int, direct runResult, x *viaRun) []string
}

func (l leg) once(env pathEnv) (viaRun, error) {
	if l.e != nil {
		return measureVia(l.e, env.dns, l.run)
	}
	r, err := l.run(l.peer.cpuTime)
	return viaRun{r: r}, err
}

// finish is the leg's row, with its proxy's peak RSS.
func (l leg) finish() pathResult {
	switch {
	case l.run == nil:
		return l.row.res
	case l.e != nil:
		peak, _ := l.e.peakRSS()
		return l.row.finish(peak)
	}
	return l.row.finish(l.peer.peakRSS())
}

// runRounds runs env.o.rounds rounds: a direct run, then each leg, their order
// reversed every other round so that none always runs on the warmer egressd,
// then each of tail (the peers) in order.
func runRounds(env pathEnv, direct func(round int) (runResult, error), legs, tail []leg) error {
	for round := range env.o.rounds {
		d, err := direct(round)
		if err != nil {
			return fmt.Errorf("direct: %w", err)
		}
		order := slices.Clone(legs)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, l := range append(order, tail...) {
			if l.run == nil { // a peer that does not carry the path
				continue
			}
			x, err := l.once(env)
			if err != nil {
				return fmt.Errorf("through %s: %w", l.row.res.Path, err)
			}
			if l.check != nil {
				l.row.res.Problems = append(l.row.res.Problems, l.check(round, d, &x)...)
			}
			l.row.add(d, x)
		}
	}
	return nil
}

// finishAll is the rows of legs.
func finishAll(legs []leg) []pathResult {
	out := make([]pathResult, len(legs))
	for i, l := range legs {
		out[i] = l.finish()
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
	l := egressdLeg(ctx, env, p, w, env.e, lo, newRow(p.name, p.desc, injects))
	l.row.res.NewConnPerRequest = p.newConn
	peers := w.peers.legs(ctx, p, w, lo)
	direct := func(int) (runResult, error) { return runCounted(ctx, p.direct(w), lo, w.up, nil) }
	if err := runRounds(env, direct, []leg{l}, peers); err != nil {
		return pathResult{}, err
	}
	res := l.finish()
	res.Peers = finishAll(peers)
	return res, nil
}

// egressdLeg is p's row rb through e: p's viaProxy target on w, what reached
// the upstream checked against what p injects, on every run, and that the
// requests went through e at all (a transparent listener is easy to bypass).
func egressdLeg(ctx context.Context, env pathEnv, p pathSpec, w *world, e *egressd, lo loadOptions, rb *rowBuilder) leg {
	return leg{row: rb, e: e,
		run: func(cpu cpuFunc) (runResult, error) { return runCounted(ctx, p.viaProxy(w), lo, w.up, cpu) },
		check: func(round int, d runResult, x *viaRun) []string {
			ps := append(injectionProblems(p.inject, round, env.o.rounds, d, x.r), scrubProblems(p, x.r, x.log)...)
			if x.log.EgressLines == 0 {
				ps = append(ps, runLabel("egressd", round, env.o.rounds)+": egressd logged no egress line: the requests did not go through it")
			}
			return ps
		}}
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

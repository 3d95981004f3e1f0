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

// viaRun is one run through egressd and what egressd did meanwhile.
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
	dnsBefore := int64(dns.Total())
	from := e.LogSize()
	r, err := load(e.cpuTime)
	if err != nil {
		return v, err
	}
	v.r = r
	if v.log, err = e.scanLog(from); err != nil {
		return v, fmt.Errorf("egressd log: %w", err)
	}
	v.dns = int64(dns.Total()) - dnsBefore
	if leafErr == nil {
		var after leafCounts
		if after, leafErr = e.leafCache(); leafErr == nil {
			v.leaf = after.sub(leafBefore)
		}
	}
	v.leafErr = leafErr
	return v, nil
}

// rowBuilder gathers the rounds of one row of the report.
type rowBuilder struct {
	res           pathResult
	directs, vias []runResult
	leaf          leafCounts
}

func newRow(name, desc, injects string) *rowBuilder {
	return &rowBuilder{res: pathResult{Path: name, Description: desc, Injects: injects}}
}

// add records one round: its direct run and its run through egressd.
func (b *rowBuilder) add(direct runResult, x viaRun) {
	b.res.Rounds = append(b.res.Rounds, newRound(direct, x.r))
	b.directs, b.vias = append(b.directs, direct), append(b.vias, x.r)
	b.res.Log.merge(x.log)
	b.res.DNSQueries += x.dns
	if x.leafErr != nil {
		b.res.LeafCacheError = x.leafErr.Error()
	} else {
		b.leaf = leafCounts{b.leaf.Hit + x.leaf.Hit, b.leaf.Miss + x.leaf.Miss}
	}
}

// finish sets the medians and e's peak RSS so far.
func (b *rowBuilder) finish(e *egressd) pathResult {
	b.res.Direct, b.res.Egressd = combine(b.directs), combine(b.vias)
	b.res.finish()
	if b.res.LeafCacheError == "" {
		lc := b.leaf
		b.res.LeafCache = &lc
	}
	b.res.PeakRSSBytes, _ = e.peakRSS()
	return b.res
}

// leg is one row's run through egressd in each round.
type leg struct {
	row *rowBuilder
	e   *egressd // nil: runRounds' e
	run func(cpuFunc) (runResult, error)
	// check returns the run's problems; it may adjust x's log first.
	check func(round int, direct runResult, x *viaRun) []string
}

// runRounds runs env.o.rounds rounds: a direct run, then each leg through e,
// the legs' order reversed every other round so that none always runs on the
// warmer egressd; after, when set, ends each round.
func runRounds(env pathEnv, e *egressd, direct func(round int) (runResult, error), legs []leg, after func(runResult) error) error {
	for round := range env.o.rounds {
		d, err := direct(round)
		if err != nil {
			return fmt.Errorf("direct: %w", err)
		}
		for k := range legs {
			l := legs[k]
			if round%2 == 1 {
				l = legs[len(legs)-1-k]
			}
			le := l.e
			if le == nil {
				le = e
			}
			x, err := measureVia(le, env.dns, l.run)
			if err != nil {
				return fmt.Errorf("through egressd (%s): %w", l.row.res.Path, err)
			}
			if l.check != nil {
				l.row.res.Problems = append(l.row.res.Problems, l.check(round, d, &x)...)
			}
			l.row.add(d, x)
		}
		if after != nil {
			if err := after(d); err != nil {
				return err
			}
		}
	}
	return nil
}

// measurePath runs a direct/through-egressd path (and its peers after egressd
// in each round, against the same direct run), checking on every run that the
// upstream received exactly what egressd had to inject.
func measurePath(ctx context.Context, env pathEnv, p pathSpec) (pathResult, error) {
	w, o, lo := env.w, env.o, env.o.load()
	injects := ""
	if p.inject != injectNone {
		injects = p.inject.String()
	}
	rb := newRow(p.name, p.desc, injects)
	rb.res.NewConnPerRequest = p.newConn
	pp := w.peers.forPath(p) // nil unless the path has peers
	l := leg{row: rb,
		run: func(cpu cpuFunc) (runResult, error) { return runCounted(ctx, p.viaProxy(w), lo, w.up, cpu) },
		check: func(round int, d runResult, x *viaRun) []string {
			return append(injectionProblems(p.inject, round, o.rounds, d, x.r), scrubProblems(p, x.r, x.log)...)
		}}
	direct := func(int) (runResult, error) { return runCounted(ctx, p.direct(w), lo, w.up, nil) }
	if err := runRounds(env, env.e, direct, []leg{l}, func(d runResult) error { return pp.round(ctx, w, lo, d) }); err != nil {
		return pathResult{}, err
	}
	res := rb.finish(env.e)
	res.Peers = pp.finish()
	return res, nil
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

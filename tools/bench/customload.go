package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
)

// The load every path makes: GETs (runLoad), POSTs with a body (hook), and
// connections dialled from a sandbox network namespace to an address that is not
// on loopback (transparent). One transport and so one keep-alive connection per client, HTTP/1.1 only, no
// compression, no environment proxy, a warm-up and then the measured window,
// every loop bounded by time and by count, every response body read to the end.

// customTarget is one side of such a path: a target (its proxy, dialAddr,
// allowDial, dialFrom and roots) with a method, a body and a check.
type customTarget struct {
	target
	method string // GET or POST
	body   []byte // sent with every request; nil for none
	// check reads the whole body of a 200 response and says whether it is
	// what the path's far side answers.
	check func(*http.Response) error
}

// runCustomLoad drives t as runLoad does. The caller reads the far side's
// counters around it (the upstream's, or the hook endpoint's).
func runCustomLoad(ctx context.Context, t customTarget, lo loadOptions, cpu func() (time.Duration, error)) (runResult, error) {
	return runClients(ctx, lo, cpu, func(ctx context.Context, dials *atomic.Int64) (*client, error) {
		return newCustomClient(ctx, t, dials)
	})
}

func newCustomClient(ctx context.Context, t customTarget, dials *atomic.Int64) (*client, error) {
	tr, err := newTransport(t.target, dials)
	if err != nil {
		return nil, err
	}
	c := &client{tr: tr}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{TLSHandshakeDone: c.countHandshake})
	req, err := http.NewRequestWithContext(ctx, t.method, t.url, nil)
	if err != nil {
		return nil, err
	}
	if t.body != nil {
		req.Header.Set("Content-Type", "application/json")
		req.ContentLength = int64(len(t.body))
	}
	c.do = func() error { return t.do(tr, req) }
	return c, nil
}

// do makes one request and has check read the whole body. A request with a body
// is a shallow copy of the client's, so each one gets a fresh body reader and the
// transport never sees a reader a previous request may still hold; one without
// is the client's, reused (net/http allows it once the previous response's body
// is closed), which keeps the client's own allocations out of the measurement.
func (t customTarget) do(tr *http.Transport, base *http.Request) error {
	req := base
	if t.body != nil {
		req = new(http.Request)
		*req = *base
		body := t.body
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return statusError{code: resp.StatusCode, reason: resp.Header.Get("Egressd-Reason")}
	}
	return t.check(resp)
}

// expectSize is a check: the body is exactly n bytes.
func expectSize(n int) func(*http.Response) error {
	return func(resp *http.Response) error {
		got, err := io.Copy(io.Discard, resp.Body)
		switch {
		case err != nil:
			return fmt.Errorf("reading body: %w", err)
		case got != int64(n):
			return fmt.Errorf("body of %d bytes, want %d", got, n)
		}
		return nil
	}
}

// expectBody is a check: the body is exactly want, and no header in refuse is
// set.
func expectBody(want []byte, refuse ...string) func(*http.Response) error {
	return func(resp *http.Response) error {
		got, err := io.ReadAll(io.LimitReader(resp.Body, int64(len(want))+1))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
		}
		if err != nil {
			return fmt.Errorf("reading body: %w", err)
		}
		for _, h := range refuse {
			if v := resp.Header.Get(h); v != "" {
				return fmt.Errorf("response carries %s: %s", h, v)
			}
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("body %q, want %q", truncate(string(got), 80), want)
		}
		return nil
	}
}

// pathEnv is what a path with its own measure function (pathSpec.measure)
// gets: the world and egressd its runs go through, the DNS stub, the options,
// the run's temp dir (for anything it starts) and where progress goes.
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
// log lines egressd wrote, how its leaf cache grew and how many queries the
// DNS stub answered meanwhile.
func measureVia(e *egressd, dns *dnsstub.Server, load func(cpu func() (time.Duration, error)) (runResult, error)) (viaRun, error) {
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

// rowBuilder gathers the rounds of one row of a path with its own measure
// function, as measurePath does for the others.
type rowBuilder struct {
	res           pathResult
	directs, vias []runResult
	leaf          leafCounts
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

// runLabel names a run in a problem, as injectionProblems does.
func runLabel(run string, round, rounds int) string {
	if rounds > 1 {
		return fmt.Sprintf("%s run, round %d", run, round+1)
	}
	return run + " run"
}

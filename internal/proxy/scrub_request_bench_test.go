package proxy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/placeholder"
	"github.com/egressd/egressd/internal/proxy"
	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/testpki"
	mitm "github.com/egressd/egressd/internal/tls"
)

// BenchmarkScrubRequest1KiB is the whole request, 1 KiB response, over a
// keep-alive HTTP/1.1 connection per arm: direct to the upstream (no egressd),
// intercepted by egressd without injection (scrubbing off), intercepted with a
// transform injected (scrubbing on, nothing to mask: make bench's intercept
// path), and that with the upstream echoing the injected value in a header (one
// replacement: make bench's credential path).
//
// The machine is shared and loaded, so: each iteration is a round in which
// every arm makes benchBatch requests, in an order drawn anew every round (an
// arm never always follows the same one, whose trailing work, like egressd's log
// line, lands in the next turn: a rotation kept the cyclic order, so the on arm
// always followed the off arm and was charged its trailing work); a turn's process CPU (getrusage: client,
// egressd and upstream all run here) is charged to its arm; and the figures are
// medians over the rounds of per-request differences, so a load spike in one
// turn moves nothing. The client's and upstream's work is the same in the three
// egressd arms, so egressd-ns/req = off - direct is egressd's CPU per request,
// scrub-ns/req = on - off what scrubbing adds to it, and scrub-% their ratio
// (echo-ns/req and echo-% likewise for on+echo).
//
// creds=100 loads 100 environment_variable credentials into the egressd of the
// on arms, whose every response is then scrubbed of their values too; the off
// arm runs on a second egressd without them, so scrub-% is what scrubbing costs
// with them all loaded. creds=0 has one egressd for the three arms:
//
//	go test -run '^$' -bench BenchmarkScrubRequest1KiB -benchtime 3000x -count 5 ./internal/proxy/
func BenchmarkScrubRequest1KiB(b *testing.B) {
	for _, creds := range []int{0, 100} {
		b.Run(fmt.Sprintf("creds=%d", creds), func(b *testing.B) { benchScrubRequest(b, creds) })
	}
}

func benchScrubRequest(b *testing.B, envCreds int) {
	f := newBenchFixture(b, envCreds)
	arms := []struct {
		c      *http.Client
		target string
	}{
		{f.direct, "https://on.bench.test:" + f.port + "/"},
		{f.off, "https://off.bench.test:" + f.port + "/"},
		{f.on, "https://on.bench.test:" + f.port + "/"},
		{f.on, "https://on.bench.test:" + f.port + "/echo"},
	}
	for _, a := range arms {
		f.get(b, a.c, a.target) // the connections and egressd's leaf, outside the figures
	}
	var egressd, scrub, echo []float64
	b.ReportAllocs()
	order := rand.New(rand.NewPCG(1, 2)) // the same orders every run
	for b.Loop() {
		cpu := make([]float64, len(arms))
		for _, i := range order.Perm(len(arms)) {
			start := processCPU()
			for range benchBatch {
				f.get(b, arms[i].c, arms[i].target)
			}
			cpu[i] = float64(processCPU()-start) / benchBatch
		}
		egressd = append(egressd, cpu[1]-cpu[0])
		scrub = append(scrub, cpu[2]-cpu[1])
		echo = append(echo, cpu[3]-cpu[1])
	}
	e, s, x := median(egressd), median(scrub), median(echo)
	b.ReportMetric(e, "egressd-ns/req")
	b.ReportMetric(s, "scrub-ns/req")
	b.ReportMetric(x, "echo-ns/req")
	b.ReportMetric(100*s/e, "scrub-%")
	b.ReportMetric(100*x/e, "echo-%")
}

// benchBatch is how many requests an arm makes in a turn.
const benchBatch = 10

// median returns the median of v (which it sorts).
func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// benchValue is what the on arms' transform injects (make bench's).
const benchValue = "bench-transform-value"

// benchFixture is egressd (tls.intercept: all) in front of a TLS upstream that
// answers 1 KiB, and a client for each side: direct, and through the egressd of
// the off arm and of the on arms (the same one without credentials).
type benchFixture struct {
	port            string
	direct, off, on *http.Client
}

func newBenchFixture(b *testing.B, envCreds int) *benchFixture {
	pki := testpki.New(b)
	up := benchUpstream(b, pki)
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	dns := dnsstub.Start(b)
	dns.Set("on.bench.test", "A 127.0.0.1")
	dns.Set("off.bench.test", "A 127.0.0.1")
	n, _ := strconv.Atoi(port)
	direct := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.Pool},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, up.Listener.Addr().String())
		}}
	f := &benchFixture{port: port, direct: &http.Client{Transport: direct}}
	f.off = benchClient(b, dns.Addr, pki, uint16(n), 0)
	f.on = f.off
	if envCreds > 0 {
		f.on = benchClient(b, dns.Addr, pki, uint16(n), envCreds)
	}
	return f
}

// benchClient starts an egressd with envCreds environment_variable credentials
// and returns a client that uses it as its proxy.
func benchClient(b *testing.B, dns string, pki *testpki.CA, port uint16, envCreds int) *http.Client {
	proxyAddr, egressdCA := benchEgressd(b, dns, pki.Pool, port, envCreds)
	pu, _ := url.Parse("http://" + proxyAddr)
	roots := pki.Pool.Clone()
	roots.AddCert(egressdCA)
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: roots}}}
}

// benchEnvCreds are n environment_variable credentials with 40-byte values,
// trusted by other hosts than the bench's: loaded, never placed.
type benchEnvCreds map[string]credential.Value

func newBenchEnvCreds(n int) (benchEnvCreds, map[string]string) {
	creds, vars := benchEnvCreds{}, map[string]string{}
	for i := range n {
		id := fmt.Sprintf("env%03d", i)
		sum := sha256.Sum256([]byte(id))
		creds[id] = credential.Value{ID: id, Type: credential.TypeEnvironmentVariable, Env: &credential.EnvVar{
			Value: "sk-" + hex.EncodeToString(sum[:])[:37], Locations: []string{credential.LocationHeader},
			TrustedDomains: []string{id + ".example.test"}}}
		vars["KEY_"+id] = id
	}
	return creds, vars
}

func (c benchEnvCreds) Get(id string) (credential.Value, error) {
	v, ok := c[id]
	if !ok {
		return v, &credential.UnavailableError{ID: id, Cause: credential.CauseNotFound}
	}
	return v, nil
}

// benchUpstream answers every request with 1 KiB of JSON; on /echo it also
// sends back the injected header, as a reflecting upstream would.
func benchUpstream(b *testing.B, pki *testpki.CA) *httptest.Server {
	body := bytes.Repeat([]byte(`{"id":1024,"kind":"item","ok":true,"data":"lorem ipsum dolor sit amet"},`), 15)[:1024]
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/echo" {
			w.Header()["X-Bench-Echo"] = r.Header["X-Bench-Injected"]
		}
		w.Header()["Content-Type"] = []string{"application/octet-stream"}
		w.Header()["Content-Length"] = []string{"1024"}
		w.Write(body)
	}))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf(b, "on.bench.test", "off.bench.test")}}
	up.StartTLS()
	b.Cleanup(up.Close)
	return up
}

// benchEgressd starts egressd's proxy with the two entries and envCreds
// environment_variable credentials, and returns its address and interception CA.
func benchEgressd(b *testing.B, dns string, upstreamCA *x509.CertPool, port uint16, envCreds int) (string, *x509.Certificate) {
	pol, err := allowlist.Compile([]allowlist.Entry{
		{Domain: "on.bench.test", Ports: []uint16{port}, Transform: []allowlist.Header{{Name: "X-Bench-Injected", Value: benchValue}}},
		{Domain: "off.bench.test", Ports: []uint16{port}},
	}, allowlist.Options{Intercept: allowlist.InterceptAll})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	self := netip.MustParseAddrPort(ln.Addr().String())
	guard, err := netguard.New(netguard.Options{UnsafeAllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Self: []netip.AddrPort{self}})
	if err != nil {
		b.Fatal(err)
	}
	ca, _, err := mitm.LoadOrCreateCA("", "", b.TempDir(), "env_bench")
	if err != nil {
		b.Fatal(err)
	}
	limits := config.Default().Limits
	snap := &proxy.Snapshot{
		Env: "env_bench", Policy: pol, Guard: guard, Limits: limits,
		Resolver:    netguard.NewResolver(dns, limits.DNS),
		UpstreamTLS: &tls.Config{RootCAs: upstreamCA, MinVersion: tls.VersionTLS12},
		Leaves:      mitm.NewLeaves(ca, mitm.LeafOptions{}),
		Injector:    inject.New(pol, nil),
	}
	if envCreds > 0 {
		creds, vars := newBenchEnvCreds(envCreds)
		snap.Placeholders = placeholder.New([]byte("bench-placeholder-key-32-bytes!!"), "env_bench", vars, nil, creds)
	}
	snap.Prepare()
	// The canonical log line is part of a request's cost: written, to nowhere.
	srv := proxy.New(snap, zerolog.New(io.Discard), metrics.New())
	go srv.Serve(ln, config.Listener{Name: "sandbox", Address: self, Mode: "proxy", Role: "sandbox"})
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		snap.Close()
	})
	return ln.Addr().String(), ca.Cert
}

// get fetches target and reads the whole body.
func (f *benchFixture) get(b *testing.B, c *http.Client, target string) {
	resp, err := c.Get(target)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != 1024 || resp.StatusCode != http.StatusOK {
		b.Fatalf("%s: %d, %d bytes, %v", target, resp.StatusCode, n, err)
	}
	if echo := resp.Header.Get("X-Bench-Echo"); echo != "" && echo == benchValue {
		b.Fatal("the injected value came back unmasked")
	}
}

// processCPU is the process's user and system CPU time, in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

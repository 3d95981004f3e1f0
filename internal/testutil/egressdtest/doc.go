// Package egressdtest runs the real egressd binary under test, for every suite that
// drives it as a subprocess (test/conformance, test/soak, cmd/egressd, bench): it
// builds the binary once per process, writes a typed config, starts `egressd run`,
// waits for its listeners, reads its admin endpoints, CA and JSON log, and stops it.
//
// The lifecycle, in the order a suite meets it:
//
//	func TestMain(m *testing.M) {
//		os.Exit(egressdtest.Main(m, egressdtest.BuildOptions{}, (*testing.M).Run))
//	}
//
//	e := egressdtest.StartT(t, egressdtest.Options{Config: cfg, Wait: egressdtest.WaitReady})
//	// ... requests through e.Proxy (an explicit proxy at that address) ...
//	line := e.EgressLine(t, reqID)                  // the canonical log line of one request
//	v := e.MetricT(t, `egressd_tunnels_active`)     // one series from /metrics
//	pool, err := e.CAPool()                         // egressd's interception CA
//	code, err := e.Stop()                           // SIGTERM, then the exit code
//
// Build (or Main) builds egressd once and sets EnvBinary, so that a test binary
// re-executed in a loopback-only network namespace (internal/testutil/netns) starts
// the same egressd without the Go toolchain; a prebuilt binary (make's bin/egressd,
// bench's -egressd) is used as is. Start is context- and error-based, for the bench;
// StartT wraps it for tests. Options.LoopbackOnly makes Start refuse to run egressd
// outside such a namespace: the suites whose configs name addresses that are not on
// this machine set it, so even a wrong egressd cannot send a byte off the machine.
//
// egressd's stdout (its JSON log) and stderr go to files in Options.Dir, never to a
// pipe this process must drain: a stalled test cannot stall egressd's logging, and a
// loud run costs no memory. Lines, Cursor and the waits read the log file.
//
// Refusal is egressd's refusal body, FreePorts picks egressd's own ports when a
// config must name them, and NodeAPI registers, reads and removes a node egressd's
// sandboxes on its API socket (docs/node.md). The echo upstream the suites pair
// with this package is internal/testutil/echo; the Vault dev server is
// internal/testutil/vaultdev.
//
// The API is shared by four suites; extend it, do not change what a name means.
package egressdtest

// Package clients_test is egressd's real-client suite: the programs agents use
// (curl, Python requests and httpx, Node undici and fetch, grpc-go, pip, git) run
// as subprocesses against the real egressd binary, in explicit mode (HTTPS_PROXY)
// and in transparent mode (from a sandbox namespace made by
// deploy/netns/egressd-netns), each case asserting what the stand-in upstream
// received and what the client printed; streaming cases also time every gRPC
// message and SSE event from the upstream's flush to the client's read.
//
// Invariant: nothing leaves the machine. The package runs inside a loopback-only
// network namespace it makes itself (netns.Main); the stand-ins listen on
// addresses added to lo there and answer for their real names through a stub DNS
// server that egressd's resolver (and, in transparent mode, its DNS guard) asks.
// README.md lists the cases.
package clients_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/netns"
)

// envGRPCClient names the grpc-go client binary (test/clients/grpcclient); TestMain
// builds it, before entering the namespace, unless it is set.
const envGRPCClient = "EGRESSD_CLIENTS_GRPC_BIN"

func TestMain(m *testing.M) {
	os.Exit(egressdtest.Main(m, egressdtest.BuildOptions{Race: egressdtest.RaceEnabled}, func(m *testing.M) int {
		if !netns.Inside() {
			cleanup, err := buildGRPCClient()
			if err != nil {
				fmt.Fprintf(os.Stderr, "clients: building the grpc-go client: %v\n", err)
				return 1
			}
			defer cleanup()
			return netns.Main(m)
		}
		if err := netns.PrivateNetnsDirs(); err != nil {
			fmt.Fprintf(os.Stderr, "clients: %v\n", err)
			return 1
		}
		code := netns.Main(m)
		if code == 0 {
			code = checkForbiddenUntouched()
		}
		return code
	}))
}

// buildGRPCClient builds test/clients/grpcclient (without -race: it is a client,
// not what is under test) and names it in envGRPCClient.
func buildGRPCClient() (func(), error) {
	if os.Getenv(envGRPCClient) != "" {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "egressd-clients-")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "grpcclient")
	if out, err := exec.Command("go", "build", "-o", bin, "./grpcclient").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%v\n%s", err, out)
	}
	os.Setenv(envGRPCClient, bin)
	return func() { os.RemoveAll(dir) }, nil
}

// checkForbiddenUntouched is TestMain's last word: a connection to evil.example's
// address during the whole run fails it, whatever the cases said.
func checkForbiddenUntouched() int {
	if sharedUp != nil && sharedUp.forbidden.Load() != 0 {
		fmt.Fprintf(os.Stderr, "clients: %s saw %d connection(s)\n", forbiddenIP, sharedUp.forbidden.Load())
		return 1
	}
	return 0
}

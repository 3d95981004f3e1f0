// Package aws_test runs AWS clients holding only egressd's placeholder key pair
// (boto3 and the AWS CLI, Debian's) through the real egressd binary to a real
// SigV4-verifying S3 server (MinIO, scripts/minio.sh), with the real keys static in
// the file backend or read from Vault's AWS secrets engine (the test Vault, whose
// engine asks MinIO's STS for assumed-role keys). Each case asserts what MinIO
// accepted (it verifies every signature under the real keys, and knows no
// placeholder) and that no real key reached the client's output.
//
// Invariant: nothing leaves the machine. The package runs inside a loopback-only
// network namespace (netns.Main); MinIO listens on an address added to lo there, and
// the S3 name resolves to it through a stub DNS server that egressd's resolver asks.
// README.md lists the cases.
package aws_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/netns"
)

func TestMain(m *testing.M) {
	os.Exit(egressdtest.Main(m, egressdtest.BuildOptions{Race: egressdtest.RaceEnabled}, func(m *testing.M) int {
		if netns.Inside() {
			if err := netns.PrivateNetnsDirs(); err != nil {
				fmt.Fprintf(os.Stderr, "aws: %v\n", err)
				return 1
			}
		}
		return netns.Main(m)
	}))
}

package deploy_test

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"
)

// TestCompose: Debian's docker-compose (1.29, which rejects a top-level name:)
// accepts the compose file as written, and egressd's config there keeps the
// admin listener on the container's loopback, publishing only the health port.
// No engine is needed: `config` only reads and validates.
func TestCompose(t *testing.T) {
	admin := readAdmin(t, readRepoFile(t, "compose/egressd.yaml"))
	if ap, err := netip.ParseAddrPort(admin.Address); !strings.HasPrefix(admin.Address, "unix://") && (err != nil || !ap.Addr().IsLoopback()) || admin.Exposed {
		t.Errorf("compose egressd.yaml admin.address %q (exposed %v): want a Unix socket or the container's loopback", admin.Address, admin.Exposed)
	}
	if admin.HealthAddress == "" {
		t.Errorf("compose egressd.yaml: no admin.health_address to publish")
	}
	dc := deployTool(t, "docker-compose")
	out, err := exec.Command(dc, "-p", "egressd-vault", "-f", "compose/docker-compose.yaml", "config", "-q").CombinedOutput()
	if err != nil {
		t.Errorf("docker-compose config: %v\n%s", err, out)
	}
}

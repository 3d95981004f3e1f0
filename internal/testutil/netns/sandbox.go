package netns

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// Sandbox is an agent sandbox made inside the test's namespace by the script
// a user runs, deploy/netns/egressd-netns: a network namespace whose TCP 80/443
// is DNATed to egressd's transparent listener on HostIP and whose DNS goes to
// egressd's DNS guard there. Programs run in it with Command, as a user runs
// them with `ip netns exec`, /etc/resolv.conf included.
type Sandbox struct {
	Name   string
	HostIP string // the veth's host side: 10.200.<index>.1
	Ports  SandboxPorts
	script string
	index  int
}

// SandboxPorts are the ports on HostIP the script redirects to.
type SandboxPorts struct{ Transparent, DNS int }

// NewSandbox brings up sandbox name (1-9 letters or digits) with
// 10.200.<index>.0/30 through script (the path of egressd-netns), IPv4 only,
// and brings it down when the test ends. It must run inside the namespace
// (Main or Run); call PrivateNetnsDirs first so that the script's files in
// /run/netns and /etc/netns are this process's own.
func NewSandbox(t testing.TB, script, name string, index int, ports SandboxPorts) *Sandbox {
	t.Helper()
	if !Inside() {
		t.Fatalf("netns.NewSandbox outside the loopback-only namespace")
	}
	sb := &Sandbox{Name: name, HostIP: fmt.Sprintf("10.200.%d.1", index), Ports: ports, script: script, index: index}
	if err := sb.run("up"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.run("down"); err != nil {
			t.Error(err)
		}
	})
	return sb
}

func (sb *Sandbox) run(verb string) error {
	cmd := exec.Command(sb.script, verb, sb.Name)
	cmd.Env = append(os.Environ(), "EGRESSD_NETNS_INDEX="+strconv.Itoa(sb.index), "EGRESSD_NETNS_IPV6=0",
		"EGRESSD_TPROXY_PORT="+strconv.Itoa(sb.Ports.Transparent), "EGRESSD_DNS_PORT="+strconv.Itoa(sb.Ports.DNS))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("egressd-netns %s %s: %v\n%s", verb, sb.Name, err, out)
	}
	return nil
}

// Command runs name with args inside the sandbox (`ip netns exec`).
func (sb *Sandbox) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", sb.Name, name}, args...)...)
}

// PrivateNetnsDirs mounts an empty tmpfs over /run/netns and /etc/netns in
// this process's own mount namespace (Main's `unshare -m` makes its mounts
// private), creating them first where they are missing: `ip netns add` and
// egressd-netns then write their files there, never beside the host's or
// another test package's sandboxes of the same name.
func PrivateNetnsDirs() error {
	if !Inside() {
		return fmt.Errorf("netns.PrivateNetnsDirs outside the loopback-only namespace")
	}
	for _, d := range []string{"/run/netns", "/etc/netns"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
			return fmt.Errorf("mounting a tmpfs on %s: %w", d, err)
		}
	}
	return nil
}

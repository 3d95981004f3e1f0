package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

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
	sb, err := UpSandbox(script, name, index, ports)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Down(); err != nil {
			t.Error(err)
		}
	})
	return sb
}

// UpSandbox is NewSandbox outside a test (the bench): the caller calls Down.
// Down first removes what a killed earlier run may have left of name.
func UpSandbox(script, name string, index int, ports SandboxPorts) (*Sandbox, error) {
	sb := &Sandbox{Name: name, HostIP: fmt.Sprintf("10.200.%d.1", index), Ports: ports, script: script, index: index}
	_ = sb.Down()
	if err := sb.run("up"); err != nil {
		return nil, err
	}
	return sb, nil
}

// Down removes the sandbox (egressd-netns down).
func (sb *Sandbox) Down() error { return sb.run("down") }

// run runs the script in its own process group (Ctrl-C must not stop it
// half-way), bounded in time.
func (sb *Sandbox) run(verb string) error {
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, sb.script, verb, sb.Name)
	cmd.Env = append(os.Environ(), "EGRESSD_NETNS_INDEX="+strconv.Itoa(sb.index), "EGRESSD_NETNS_IPV6=0",
		"EGRESSD_TPROXY_PORT="+strconv.Itoa(sb.Ports.Transparent), "EGRESSD_DNS_PORT="+strconv.Itoa(sb.Ports.DNS))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("egressd-netns %s %s: %v\n%s", verb, sb.Name, err, out)
	}
	return nil
}

// scriptTimeout bounds one egressd-netns run.
const scriptTimeout = time.Minute

// Dial connects from inside the sandbox: the socket is made on an OS thread
// that has joined the sandbox's network namespace, which then rejoins its
// own. A thread that cannot rejoin is never reused: its goroutine ends
// locked to it, and the runtime ends the thread.
func (sb *Sandbox) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		c, rejoined, err := sb.dialInside(ctx, network, addr)
		if rejoined {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}

// dialInside dials from the sandbox's namespace on this locked thread and
// reports whether the thread is back in its own namespace.
func (sb *Sandbox) dialInside(ctx context.Context, network, addr string) (c net.Conn, rejoined bool, err error) {
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, err
	}
	defer home.Close()
	ns, err := os.Open("/run/netns/" + sb.Name)
	if err != nil {
		return nil, true, err
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("joining the sandbox's network namespace: %w", err)
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err = d.DialContext(ctx, network, addr)
	if rerr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); rerr != nil {
		if c != nil {
			c.Close()
		}
		return nil, false, fmt.Errorf("rejoining this process's network namespace: %w", rerr)
	}
	return c, true, err
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

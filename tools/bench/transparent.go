package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/netns"
)

// The transparent path: the same spliced HTTPS requests through one egressd,
// from a sandbox namespace whose TCP 443 egressd-netns DNATs to egressd's
// transparent listener, through its explicit listener with CONNECT, and direct.
//
// It needs root and never touches the host's network: the bench re-executes
// itself under `unshare -rnm` with -paths transparent -json, and that copy,
// alone in a network namespace with only lo, makes the sandbox namespace,
// measures, always runs `egressd-netns down`, and prints its rows as JSON for
// the parent's report. Its tmpfs over /run/netns and /etc/netns keeps `ip
// netns` from seeing the host's files. The stand-in upstream address is one
// egressd's guard treats as public, as a real upstream would be.

const (
	transparentHost = "tp." + benchZone
	// standInAddr is public to egressd's guard, and exists only on the lo of
	// the bench's own namespace.
	standInAddr            = "93.184.216.34"
	standInPort            = "443"
	netnsScript            = "deploy/netns/egressd-netns" // from the repository root
	netnsName              = "egrbench"
	netnsIndex             = 1 // 10.200.1.0/30, in the bench's own namespace
	tproxyPort             = 15002
	dnsPort                = 15053
	envBenchNetns          = "EGRESSD_IN_NETNS" // marks the copy, as internal/testutil/netns's
	transparentExplicitRow = "transparent-explicit"
	childStopDelay         = time.Minute // for the copy to clean up after SIGTERM
)

func transparentPathSpec() pathSpec {
	return pathSpec{
		name: "transparent",
		desc: fmt.Sprintf("GET https://%s/ over HTTP/1.1 keep-alive from a sandbox namespace (deploy/netns/egressd-netns): TCP to %s:%s DNATed to egressd's transparent listener on 10.200.%d.1:%d, "+
			"which peeks the SNI, resolves the name itself and splices; direct: the same from the bench's namespace; compared with %s. In a namespace of its own (unshare -rnm); needs root",
			transparentHost, standInAddr, standInPort, netnsIndex, tproxyPort, transparentExplicitRow),
		measure: measureTransparent,
	}
}

// measureTransparent skips the path when it cannot run here, re-executes the
// bench in a namespace of its own when it runs outside one, and measures when
// it is that copy.
func measureTransparent(ctx context.Context, env pathEnv) ([]pathResult, error) {
	if netns.Inside() { // not just envBenchNetns: a stray one in a shell is no namespace
		return measureTransparentInside(ctx, env)
	}
	if why := transparentUnavailable(); why != "" {
		return []pathResult{{Path: "transparent", Description: transparentPathSpec().desc, Skipped: why}}, nil
	}
	return reexecTransparent(ctx, env)
}

// transparentUnavailable says why the path cannot run here, or "".
func transparentUnavailable() string {
	if os.Geteuid() != 0 {
		return "needs root (egressd-netns makes a namespace, a veth and iptables rules, inside a namespace of the bench's own)"
	}
	for _, tool := range []string{"ip", "iptables", "ip6tables", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found (scripts/install-netns-deps.sh installs iproute2 and iptables; unshare is in util-linux)"
		}
	}
	if fi, err := os.Stat(netnsScript); err != nil || fi.IsDir() {
		return "no " + netnsScript + " in the working directory (run from the repository root, as make bench does)"
	}
	out, err := exec.Command("unshare", "-rnm", "--", "ip", "link", "set", "lo", "up").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("unshare -rnm does not work here (%v): %s", err, lastLine(string(out)))
	}
	return ""
}

// reexecTransparent runs `bench -paths transparent -json` with the same
// settings under unshare -rnm, bringing lo up first, and returns the rows it
// reports. Its stderr is the bench's; Ctrl-C or SIGTERM here sends it SIGTERM,
// and it cleans up before it exits.
func reexecTransparent(ctx context.Context, env pathEnv) ([]pathResult, error) {
	// The same flags; the last -paths and -json win.
	args := append([]string{"-rnm", "--", "/bin/sh", "-c", `ip link set lo up && exec "$0" "$@"`, os.Args[0]}, env.o.args...)
	args = append(args, "-paths", "transparent", "-json")
	fmt.Fprintln(env.stderr, "bench: transparent: re-running the bench in a namespace of its own (unshare -rnm)")
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "unshare", args...)
	cmd.Env = append(os.Environ(), envBenchNetns+"=1")
	cmd.Stdout, cmd.Stderr = &out, env.stderr
	// Its own process group, so that Ctrl-C reaches it once, as this SIGTERM.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = childStopDelay
	runErr := cmd.Run()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted: %w", err)
	}
	var exit *exec.ExitError
	if runErr != nil && (!errors.As(runErr, &exit) || exit.ExitCode() != exitErrors) {
		return nil, fmt.Errorf("in a namespace of its own: %w (its messages are above)", runErr)
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return nil, fmt.Errorf("in a namespace of its own: its report: %w", err)
	}
	if len(rep.Paths) == 0 {
		return nil, errors.New("in a namespace of its own: no rows in its report")
	}
	if rep.EgressdExit != "" {
		rep.Paths[0].Problems = append(rep.Paths[0].Problems, "the namespace's first egressd did not exit cleanly: "+rep.EgressdExit)
	}
	return rep.Paths, nil
}

// measureTransparentInside is the path in the bench's own namespace.
func measureTransparentInside(ctx context.Context, env pathEnv) (rows []pathResult, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the copy cleans up even when the bench that started it was killed
		for ppid := os.Getppid(); ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
			if os.Getppid() != ppid {
				cancel()
			}
		}
	}()
	if err := netns.PrivateNetnsDirs(); err != nil { // refuses outside a namespace of the bench's own
		return nil, err
	}
	script, err := filepath.Abs(netnsScript)
	if err != nil {
		return nil, err
	}
	sb, err := netns.UpSandbox(script, netnsName, netnsIndex, netns.SandboxPorts{Transparent: tproxyPort, DNS: dnsPort})
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := sb.Down(); derr != nil {
			if err == nil && len(rows) > 0 {
				rows[0].Problems = append(rows[0].Problems, derr.Error())
			} else {
				err = errors.Join(err, derr)
			}
		}
	}()
	if out, err := exec.Command("ip", "addr", "add", standInAddr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip addr add %s/32 dev lo: %v: %s", standInAddr, err, bytes.TrimSpace(out))
	}
	up := env.w.up
	if _, err := up.srv.Listen(net.JoinHostPort(standInAddr, standInPort), &up.cert); err != nil {
		return nil, fmt.Errorf("upstream on %s: %w", standInAddr, err)
	}
	env.dns.Set(transparentHost, "A "+standInAddr)
	te, err := startTransparentEgressd(ctx, env.o.egressd, filepath.Join(env.dir, "transparent"), env.dns.Addr, sb.HostIP)
	if err != nil {
		return nil, fmt.Errorf("egressd with a transparent listener: %w", err)
	}
	defer func() {
		if msg := te.stop(); msg != "" && len(rows) > 0 {
			rows[0].Problems = append(rows[0].Problems, "its egressd did not exit cleanly: "+msg)
		}
	}()
	return measureTransparentRuns(ctx, env, te, sb)
}

// measureTransparentRuns returns the transparent row and the
// transparent-explicit row, which share the direct runs.
func measureTransparentRuns(ctx context.Context, env pathEnv, te *egressd, sb *netns.Sandbox) ([]pathResult, error) {
	lo := env.o.load()
	direct := target{url: "https://" + transparentHost + "/", dialAddr: net.JoinHostPort(standInAddr, standInPort),
		allowDial: allowStandIn, roots: env.w.up.roots}
	tp, explicit := direct, direct
	tp.dialFrom = sb.Dial
	explicit.dialAddr, explicit.proxy = "", te.proxyURL
	via := func(t target) pathSpec { return pathSpec{viaProxy: func(*world) target { return t }} }
	rows := []*row{egressdRow(ctx, env, via(tp), env.w, te, lo, newRow("transparent", transparentPathSpec().desc, "")),
		egressdRow(ctx, env, via(explicit), env.w, te, lo, newRow(transparentExplicitRow, fmt.Sprintf("the transparent row's requests through the same egressd's explicit listener: CONNECT %s:%s from the bench's namespace, spliced (the transparent row's direct runs)", transparentHost, standInPort), ""))}
	if err := runRounds(env, func(int) (runResult, error) { return runCounted(ctx, direct, lo, env.w.up, nil) }, rows, nil); err != nil {
		return nil, err
	}
	return finishAll(rows), nil
}

// allowStandIn lets the transparent path's clients dial the stand-in upstream
// (on lo, in the bench's own namespace) besides loopback.
func allowStandIn(addr string) error {
	if addr == net.JoinHostPort(standInAddr, standInPort) {
		return nil
	}
	return loopbackOnly(addr)
}

// startTransparentEgressd starts the transparent path's egressd in dir and
// returns once its listeners and /healthz are up.
func startTransparentEgressd(ctx context.Context, bin, dir, dnsAddr, hostIP string) (*egressd, error) {
	e, err := startEgressd(ctx, bin, dir, transparentConfig(dnsAddr, hostIP), map[string]string{credentialsFile: "{}\n"}) // no entry names a credential
	if err == nil && e.Addrs["transparent"] == "" {
		e.stop()
		return nil, errors.New("no listening line for the transparent listener")
	}
	return e, err
}

// transparentConfig is the transparent path's egressd: its explicit listener,
// a transparent one and the DNS guard on the veth's host side (as a deployment
// has them), and transparentHost:443, spliced, as the only entry.
func transparentConfig(dnsAddr, hostIP string) *egressdtest.Config {
	cfg := baseConfig(dnsAddr)
	cfg.Listeners = []egressdtest.Listener{{Name: benchListener, Address: "127.0.0.1:0", Mode: "proxy"},
		{Name: "transparent", Address: net.JoinHostPort(hostIP, strconv.Itoa(tproxyPort)), Mode: "transparent"}}
	cfg.DNS = &egressdtest.DNS{Listen: net.JoinHostPort(hostIP, strconv.Itoa(dnsPort))}
	cfg.Policy.Allowlist = []egressdtest.Entry{{Domain: transparentHost, Ports: []int{portNum(net.JoinHostPort(standInAddr, standInPort))}}}
	cfg.Network.UnsafeAllowCIDRs, cfg.TLS.UpstreamCAFile = nil, ""
	return cfg
}

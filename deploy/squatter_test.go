package deploy_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// A squatter is a process of another user that binds one of egressd's ports
// before egressd starts or while it is down, and answers as egressd would ("allow").
// In the shipped deployments nothing it sends reaches the runtime or the sandbox:
// the OUTPUT rules drop what leaves egressd's ports unless egressd's uid sent it.

// squatterUID is the squatter's uid: neither egressd's nor root.
const squatterUID = 4242

// squat starts a squatter as uid on network ("tcp" or "udp") host:port, which
// answers every connection or datagram with answer; it is stopped at the test's
// end, or by the returned function.
func squat(t *testing.T, uid int, network, host, port, answer string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "setpriv", "--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(uid), "--clear-groups", "--",
		"perl", "-MIO::Socket::INET", "-e", squatterPerl, network, host, port, answer)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() { cancel(); cmd.Wait() }
	t.Cleanup(stop)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "bound\n" {
		t.Fatalf("squatter on %s %s:%s did not bind: %q %v", network, host, port, line, err)
	}
	return stop
}

// squatterPerl binds, says "bound", and answers forever (perl is on every host and
// init image the deploy tests run on; the test binary itself could not be run as
// another uid from its private build directory).
const squatterPerl = `
my ($net, $host, $port, $answer) = @ARGV;
$| = 1;
if ($net eq "udp") {
  my $s = IO::Socket::INET->new(Proto => "udp", LocalAddr => $host, LocalPort => $port) or die "bind: $!";
  print "bound\n";
  while (1) { my $from = $s->recv(my $buf, 512); $s->send($answer, 0, $from) if defined $from; }
}
my $s = IO::Socket::INET->new(Listen => 16, LocalAddr => $host, LocalPort => $port, ReuseAddr => 1) or die "bind: $!";
print "bound\n";
while (my $c = $s->accept) {
  sysread($c, my $req, 4096); # read before answering: closing over unread bytes sends a reset
  print $c $answer;
  shutdown($c, 1);
  while (sysread($c, $req, 4096)) {}
  close $c;
}
`

// listenAs opens a socket whose owner, for iptables' owner match, is uid: it is
// made on a thread whose filesystem uid is uid (the match reads the socket file's
// fsuid), so the test can stand in for egressd's uid while keeping root.
func listenAs[T any](t *testing.T, uid int, open func() (T, error)) T {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, _ := unix.SetfsuidRetUid(uid)
	defer unix.SetfsuidRetUid(prev)
	if now, _ := unix.SetfsuidRetUid(-1); now != uid { // -1 changes nothing and says what is set
		t.Fatalf("setfsuid(%d): fsuid is %d", uid, now)
	}
	v, err := open()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// listenTCPAs and listenUDPAs are listenTCP and listenUDP with uid's sockets.
func listenTCPAs(t *testing.T, uid int, host, port string) net.Listener {
	t.Helper()
	ln := listenAs(t, uid, func() (net.Listener, error) { return net.Listen("tcp", net.JoinHostPort(host, port)) })
	t.Cleanup(func() { ln.Close() })
	return ln
}

func listenUDPAs(t *testing.T, uid int, host, port string) net.PacketConn {
	t.Helper()
	pc := listenAs(t, uid, func() (net.PacketConn, error) { return net.ListenPacket("udp", net.JoinHostPort(host, port)) })
	t.Cleanup(func() { pc.Close() })
	return pc
}

// ask is a bash snippet that connects to host:port, sends req and prints what
// comes back; udpAsk sends one DNS query (A evil.test, ID 0x1234) and prints the
// first bytes of the answer in hex.
func ask(host, port, req string) string {
	return fmt.Sprintf("exec 3<>/dev/tcp/%s/%s && printf %q >&3 && cat <&3", host, port, req)
}

func udpAsk(host, port string) string {
	return fmt.Sprintf(`exec 3<>/dev/udp/%s/%s && printf '\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04evil\x04test\x00\x00\x01\x00\x01' >&3 && head -c 4 <&3 | od -An -tx1`, host, port)
}

// dnsAnswered reports whether udpAsk's output is an answer to its query.
func dnsAnswered(out string) bool { return strings.HasPrefix(strings.TrimSpace(out), "12 34") }

// hookCall is what the squatter tests send to a listener: a hook call's head.
const hookCall = "POST /hooks/pre HTTP/1.1\r\nHost: policy.test\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"

// squatterAllow is what a squatter answers: the decision the runtime must never read.
const squatterAllow = "HTTP/1.1 200 OK\r\nContent-Length: 20\r\nConnection: close\r\n\r\n{\"decision\":\"allow\"}"

// kubernetesSquatter: in the pod, egressd's hooks listener (egressd's uid) answers the
// runtime; once it is gone, a squatter of the agent's uid binds its port and
// answers "allow", and the runtime reads nothing (its connect never completes);
// a squatter on the DNS guard's port answers the agent's queries, and the agent
// reads nothing. As a control, without the init rules' drop the runtime does read
// the squatter's allow, so the check can see it. The rules are restored after.
func kubernetesSquatter(t *testing.T, ownPorts, hooksPort, dnsPort, runtimeUID string, hooksLn net.Listener, dnsUDP net.PacketConn, initRules func() string) {
	runtime, err := strconv.Atoi(runtimeUID)
	if err != nil {
		t.Fatal(err)
	}
	hooksLn.Close()
	dnsUDP.Close()
	stopEgressd := squat(t, egressdUID, "tcp", "127.0.0.1", hooksPort, "egressd's answer\n")
	if out, _ := asUIDOutput(runtime, 3*time.Second, ask("127.0.0.1", hooksPort, hookCall)); out != "egressd's answer\n" {
		t.Fatalf("the runtime got %q from egressd's uid on the hooks port, want egressd's answer", out)
	}
	stopEgressd()

	squat(t, 1000, "tcp", "127.0.0.1", hooksPort, squatterAllow)
	squat(t, 1000, "udp", "127.0.0.1", dnsPort, "squatted")
	runtimeAsks := func() string {
		out, _ := asUIDOutput(runtime, 2*time.Second, ask("127.0.0.1", hooksPort, hookCall))
		return out
	}
	agentAsks := func() string {
		out, _ := asUIDOutput(1000, 2*time.Second, udpAsk("10.96.0.10", "53"))
		return out
	}
	if out := runtimeAsks(); out != "" {
		t.Errorf("the runtime read %q from a squatter on the hooks port, want nothing", out)
	}
	if out := agentAsks(); out != "" {
		t.Errorf("the agent read %q from a squatter on the DNS guard's port, want nothing", out)
	}

	// Control: without the drop rules the same squatters are heard.
	for _, tool := range []string{"iptables", "ip6tables"} {
		run(t, tool, "-w", "-D", "EGRESSD_OUTPUT", "-p", "tcp", "-m", "multiport", "--sports", ownPorts,
			"!", "--tcp-flags", "RST", "RST", "-j", "DROP")
		run(t, tool, "-w", "-D", "EGRESSD_OUTPUT", "-p", "udp", "--sport", dnsPort, "-j", "DROP")
	}
	if out := runtimeAsks(); !strings.Contains(out, `"allow"`) {
		t.Errorf("control failed: without the drop the runtime read %q, not the squatter's allow: the check above proves nothing", out)
	}
	if out := agentAsks(); out == "" {
		t.Errorf("control failed: without the drop the agent read nothing from the DNS squatter")
	}
	initRules()
}

// asUIDOutput runs a bash snippet as uid (and gid) uid, killed after d, and
// returns its standard output.
func asUIDOutput(uid int, d time.Duration, snippet string) (string, error) {
	id := strconv.Itoa(uid)
	secs := strconv.FormatFloat(d.Seconds(), 'f', 1, 64)
	out, err := exec.Command("setpriv", "--reuid="+id, "--regid="+id, "--clear-groups", "--",
		"timeout", secs, "bash", "-c", snippet).Output()
	return string(out), err
}

// TestNetnsSquatter runs the real egressd, as egressdUID, for a sandbox made by
// egressd-netns (EGRESSD_UID=egressdUID): the sandbox reads egressd's refusal of a
// request and its DNS guard's answer. Then egressd is killed outright (parent and
// worker: a crash of the whole service) and a squatter of another uid binds both
// ports and answers: the sandbox's connection gets no byte (its connect never
// completes) and its DNS query no answer. As a control, without the kit's OUTPUT
// rules the sandbox does read the squatter's answer; `up` then repairs them.
func TestNetnsSquatter(t *testing.T) {
	if os.Getenv(envHost) == "" {
		requireTools(t, "perl")
		_, cleanup, err := egressdtest.Build(egressdtest.BuildOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cleanup)
	}
	if !inNamespaces(t, []string{"host"}, []string{"sandbox"}) {
		return
	}
	run(t, "ip", "link", "set", "lo", "up")
	s := &sandbox{name: nsName("sandbox"), env: []string{"EGRESSD_UID=" + strconv.Itoa(egressdUID)}}
	s.script(t, "up")
	t.Cleanup(func() { s.scriptErr("down") })
	want := "-A " + s.chain() + "-OUT -m owner --uid-owner " + strconv.Itoa(egressdUID) + " -j RETURN"
	if rules := output(t, "iptables", "-w", "-S", s.chain()+"-OUT"); !strings.Contains(rules, want) {
		t.Fatalf("up with EGRESSD_UID=%d: %s lacks %q", egressdUID, rules, want)
	}

	e := startAs(t, egressdUID, squatterConfig)
	sandboxAsks := func() (string, string) {
		tcp, _ := s.exec(3*time.Second, ask(remoteV4, "80", "GET / HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n"))
		udp, _ := s.exec(2*time.Second, udpAsk(remoteV4, "53"))
		return tcp, udp
	}
	tcp, udp := sandboxAsks()
	if !strings.Contains(tcp, "403") || !strings.Contains(tcp, "not_allowlisted") {
		t.Fatalf("the sandbox read %q from egressd, want its 403 not_allowlisted", tcp)
	}
	if !dnsAnswered(udp) {
		t.Fatalf("the sandbox's DNS query got %q from egressd's guard, want an answer", udp)
	}

	e.Kill()
	squat(t, squatterUID, "tcp", hostV4, tproxyPort, squatterAllow)
	squat(t, squatterUID, "udp", hostV4, dnsPort, "squatted")
	start := time.Now()
	tcp, udp = sandboxAsks()
	if tcp != "" || udp != "" {
		t.Fatalf("the sandbox read %q (TCP) and %q (DNS) from a squatter on egressd's ports, want nothing", tcp, udp)
	}
	t.Logf("squatter as uid %d on %s:%s and :%s: the sandbox read nothing in %v", squatterUID, hostV4, tproxyPort, dnsPort, time.Since(start).Round(time.Millisecond))

	// Control: without the kit's OUTPUT jump, the squatter is heard.
	for _, tool := range []string{"iptables", "ip6tables"} {
		run(t, tool, "-w", "-D", "OUTPUT", "-o", s.hostIf(), "-j", s.chain()+"-OUT")
	}
	if tcp, udp := sandboxAsks(); !strings.Contains(tcp, `"allow"`) || udp == "" {
		t.Errorf("control failed: without the OUTPUT rules the sandbox read %q and %q, not the squatter's answers: the check above proves nothing", tcp, udp)
	}
	s.script(t, "up")
	if tcp, _ := sandboxAsks(); tcp != "" {
		t.Errorf("after up repaired the rules, the sandbox read %q from the squatter", tcp)
	}
}

// squatterConfig is egressd's config for TestNetnsSquatter: the kit's addresses
// with the test's ports; nothing is allowed, so egressd's answer is its refusal.
var squatterConfig = &egressdtest.Config{
	Version: 1, Environment: "env_squatter",
	Listeners:   []egressdtest.Listener{{Name: "sandbox", Address: hostV4 + ":" + tproxyPort, Mode: "transparent", Role: "sandbox"}},
	Admin:       &egressdtest.Admin{Address: "127.0.0.1:0"},
	Policy:      egressdtest.Policy{Allowlist: []egressdtest.Entry{{Domain: "allowed.test"}}},
	DNS:         &egressdtest.DNS{Listen: hostV4 + ":" + dnsPort},
	Credentials: &egressdtest.Credentials{Backend: "file", File: "credentials.json"},
	Log:         &egressdtest.Log{Level: "info", Format: "json"},
	StateDir:    "state",
}

// startAs starts egressd as uid, in a directory (and from a copy of the binary)
// that uid can use: the test's own are root's and private.
func startAs(t *testing.T, uid int, cfg *egressdtest.Config) *egressdtest.Egressd {
	t.Helper()
	base, err := os.MkdirTemp("", "egressd-squatter-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	dir, bin := filepath.Join(base, "run"), filepath.Join(base, "egressd")
	copyFile(t, egressdtest.Binary(), bin, 0o755)
	yaml, err := cfg.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"": "", egressdtest.ConfigName: string(yaml), "credentials.json": "{}"} {
		path := filepath.Join(dir, name)
		if name != "" {
			copyFile(t, "", path, 0o600, content)
		}
		if err := os.Chown(path, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	return egressdtest.StartT(t, egressdtest.Options{
		Bin: bin, Dir: dir, ConfigPath: filepath.Join(dir, egressdtest.ConfigName),
		Wrap: []string{"setpriv", "--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(uid), "--clear-groups", "--"},
		Wait: egressdtest.WaitReady,
	})
}

// copyFile writes to with mode: the content of from, or content when from is "".
func copyFile(t *testing.T, from, to string, mode os.FileMode, content ...string) {
	t.Helper()
	b, err := []byte(strings.Join(content, "")), error(nil)
	if from != "" {
		b, err = os.ReadFile(from)
	}
	if err == nil {
		err = os.WriteFile(to, b, mode)
	}
	if err != nil {
		t.Fatal(err)
	}
}

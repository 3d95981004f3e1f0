package deploy_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/origdst"
	"github.com/egressd/egressd/internal/testutil/netns"
)

// The netns script test never touches this machine's own network
// namespace. The parent test creates a throwaway "host" namespace and
// re-runs itself there with nsenter (inNamespaces); the script then builds
// the sandbox namespace and its veth against that host namespace. The host
// namespace's only other interface is a stand-in uplink (up0), a veth whose
// peer sits in a third namespace ("far") with no route onward: whatever the host
// namespace routes out through it ends there, and a counting rule there
// shows whether anything from the sandbox arrived. Every address is a
// documentation or private address that exists only in these namespaces.
const (
	envHost = "EGRESSD_DEPLOY_IN_NETNS" // in the test's second run: the namespace it runs in
	envNS   = "EGRESSD_DEPLOY_NETNS_"   // + role: the name of that role's namespace
	script  = "netns/egressd-netns"

	index      = "7" // EGRESSD_NETNS_INDEX: 10.200.7.0/30
	hostV4     = "10.200.7.1"
	hostV6     = "fd00:200:0:7::1"
	tproxyPort = "25002" // non-default ports, so the env vars are exercised
	dnsPort    = "25053"
	remoteV4   = "203.0.113.10" // TEST-NET-3: routed nowhere but up0
	remoteV6   = "2001:db8::10"
)

// TestNetnsScript brings a sandbox up twice, checks its rules and what
// they let through, checks that the host side holds when the sandbox's own
// rules are flushed, and brings it down twice, leaving the rules as they
// were and no namespace, link or file behind.
func TestNetnsScript(t *testing.T) {
	if !inNamespaces(t, []string{"host", "far"}, []string{"sandbox"}) {
		return
	}
	netnsScriptChild(t)
}

// inNamespaces makes this test run inside a namespace of its own. In the
// test binary that go test started it creates a fresh namespace for each
// role in create (the first is where the test will run) and picks a unique
// name for each role in reserve (a namespace the test itself makes), runs
// this test again inside the first with nsenter, reports the result and
// deletes them all; it returns false there. In that second run it returns
// true, and nsName gives the names. Unlike netns.Run (unshare -rn), the
// namespaces are real root's, so iptables owner matches, setpriv and ip
// netns work in them.
func inNamespaces(t *testing.T, create, reserve []string) bool {
	t.Helper()
	if ns := os.Getenv(envHost); ns != "" {
		// A stray variable in a developer's shell must not run the body
		// against this machine's own network.
		self, err1 := os.Stat("/proc/self/ns/net")
		want, err2 := os.Stat("/run/netns/" + ns)
		if err1 != nil || err2 != nil || !os.SameFile(self, want) {
			t.Fatalf("%s=%s, but this process is not in that namespace (%v, %v)", envHost, ns, err1, err2)
		}
		return true
	}
	requireTools(t, "ip", "iptables", "ip6tables", "iptables-save", "ip6tables-save", "nsenter", "setpriv", "bash", "timeout", "perl")
	var env []string
	for i, role := range append(slices.Clone(create), reserve...) {
		name := "egr" + role[:1] + randomHex(t)
		env = append(env, envNS+role+"="+name)
		if i == 0 {
			env = append(env, envHost+"="+name)
		}
		if i < len(create) {
			run(t, "ip", "netns", "add", name)
		}
		t.Cleanup(func() {
			if i >= len(create) { // the test made it; it is gone unless the test failed half way
				exec.Command("ip", "netns", "del", name).Run()
				os.RemoveAll("/etc/netns/" + name)
				return
			}
			if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v\n%s", name, err, out)
			}
		})
	}
	first := nsName0(env)
	args := []string{"--net=/run/netns/" + first, "--", os.Args[0],
		"-test.run=" + netns.RunPattern(t.Name()), "-test.count=1", "-test.v=true"}
	if dl, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(dl).String())
	}
	cmd := exec.Command("nsenter", args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("in namespace %s: %v\n%s", first, err, out)
	}
	t.Logf("in namespace %s:\n%s", first, out)
	return false
}

// nsName0 is the namespace the second run runs in.
func nsName0(env []string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, envHost+"="); ok {
			return v
		}
	}
	return ""
}

// nsName is the namespace inNamespaces named for role.
func nsName(role string) string { return os.Getenv(envNS + role) }

// netnsScriptChild runs in the throwaway host namespace.
func netnsScriptChild(t *testing.T) {
	s := &sandbox{name: nsName("sandbox")}
	run(t, "ip", "link", "set", "lo", "up")
	fakeUplink(t)
	existingHostRules(t)
	forward := readFile(t, "/proc/sys/net/ipv4/ip_forward")
	before := ruleset(t)

	s.script(t, "up")
	once := ruleset(t)
	s.script(t, "up")
	if again := ruleset(t); again != once {
		t.Fatalf("second up changed the rules:\n--- after one up\n%s\n--- after two\n%s", once, again)
	}
	if got := readFile(t, "/proc/sys/net/ipv4/ip_forward"); got != forward {
		t.Fatalf("up changed ip_forward from %s to %s", forward, got)
	}
	s.checkInstalled(t)

	t.Run("redirected", s.testRedirected)
	t.Run("dropped", s.testDropped)
	t.Run("host side holds", s.testHostSideHolds)

	s.script(t, "down")
	s.script(t, "down")
	s.checkRemoved(t, before)
}

// sandbox is one namespace of the netns script; env is added to the script's.
type sandbox struct {
	name string
	env  []string
}

func (s *sandbox) hostIf() string { return "egr-" + s.name + "-h" }
func (s *sandbox) chain() string  { return "EGRESSD-" + s.name }

// script runs deploy/netns/egressd-netns CMD NAME with the test's ports.
func (s *sandbox) script(t *testing.T, cmd string) string {
	t.Helper()
	out, err := s.scriptErr(cmd)
	if err != nil {
		t.Fatalf("egressd-netns %s %s: %v\n%s", cmd, s.name, err, out)
	}
	return out
}

func (s *sandbox) scriptErr(cmd string) (string, error) {
	c := exec.Command(script, cmd, s.name)
	c.Env = append(append(os.Environ(), "EGRESSD_NETNS_INDEX="+index,
		"EGRESSD_TPROXY_PORT="+tproxyPort, "EGRESSD_DNS_PORT="+dnsPort), s.env...)
	out, err := c.CombinedOutput()
	return string(out), err
}

// checkInstalled looks at what up made: the namespace, the link, the
// chains, and the FORWARD drop ahead of the host's own rules.
func (s *sandbox) checkInstalled(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/run/netns/" + s.name); err != nil {
		t.Fatalf("namespace %s: %v", s.name, err)
	}
	if !strings.Contains(output(t, "ip", "netns", "list"), s.name) {
		t.Fatalf("ip netns list lacks %s", s.name)
	}
	run(t, "ip", "link", "show", s.hostIf())
	for _, c := range []struct {
		tool, table, want string
	}{
		{"iptables", "nat", "-A " + s.chain() + "-NAT -p tcp -m multiport --dports 80,443 -j DNAT --to-destination " + hostV4 + ":" + tproxyPort},
		{"iptables", "nat", "-A " + s.chain() + "-NAT -p udp -m udp --dport 53 -j DNAT --to-destination " + hostV4 + ":" + dnsPort},
		{"ip6tables", "nat", "-A " + s.chain() + "-NAT -p tcp -m multiport --dports 80,443 -j DNAT --to-destination [" + hostV6 + "]:" + tproxyPort},
		{"iptables", "filter", "-A " + s.chain() + "-FWD -j DROP"},
		{"ip6tables", "filter", "-A " + s.chain() + "-FWD -j DROP"},
		{"iptables", "filter", "-A " + s.chain() + "-IN -j DROP"},
		// Only egressd's uid (root here: no user egressd) answers from its ports.
		{"iptables", "filter", "-A " + s.chain() + "-OUT -m owner --uid-owner 0 -j RETURN"},
		{"iptables", "filter", "-A " + s.chain() + "-OUT -p tcp -m multiport --sports " + tproxyPort + "," + dnsPort + " -m tcp ! --tcp-flags RST RST -j DROP"},
		{"ip6tables", "filter", "-A " + s.chain() + "-OUT -p udp -m udp --sport " + dnsPort + " -j DROP"},
		{"ip6tables", "filter", "-A OUTPUT -o " + s.hostIf() + " -j " + s.chain() + "-OUT"},
	} {
		if rules := output(t, c.tool, "-w", "-t", c.table, "-S"); !strings.Contains(rules, c.want) {
			t.Errorf("%s -t %s -S lacks %q:\n%s", c.tool, c.table, c.want, rules)
		}
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		fwd := strings.Split(output(t, tool, "-w", "-S", "FORWARD"), "\n")
		if len(fwd) < 3 || !strings.HasSuffix(fwd[1], "-j "+s.chain()+"-FWD") || !strings.HasSuffix(fwd[2], "-j "+s.chain()+"-FWD") {
			t.Errorf("%s FORWARD does not start with the sandbox's drop:\n%s", tool, strings.Join(fwd, "\n"))
		}
	}
	if out := s.script(t, "status"); !strings.Contains(out, s.chain()+"-NAT") || !strings.Contains(out, hostV4) {
		t.Errorf("status output lacks the chains or address:\n%s", out)
	}
}

// testRedirected: TCP 80/443 to any address reaches the transparent
// listener, which reads the address the sandbox asked for; DNS to any
// address reaches the DNS guard port.
func (s *sandbox) testRedirected(t *testing.T) {
	ln4 := listenTCP(t, hostV4, tproxyPort)
	ln6 := listenTCP(t, hostV6, tproxyPort)
	for _, c := range []struct {
		ln     net.Listener
		remote string
		port   string
	}{{ln4, remoteV4, "443"}, {ln4, remoteV4, "80"}, {ln6, remoteV6, "443"}} {
		if out, err := s.exec(3*time.Second, tcpSend(c.remote, c.port)); err != nil {
			t.Fatalf("connect %s port %s from the sandbox: %v\n%s", c.remote, c.port, err, out)
		}
		want := netip.AddrPortFrom(netip.MustParseAddr(c.remote), mustPort(c.port))
		if got := acceptOrigDst(t, c.ln); got != want {
			t.Errorf("original destination %s, want %s", got, want)
		}
	}
	dnsUDP := listenUDP(t, hostV4, dnsPort)
	s.exec(3*time.Second, udpSend(remoteV4, "53"))
	if !received(dnsUDP, time.Second) {
		t.Error("UDP 53 to another address did not reach the DNS guard port")
	}
	dnsTCP := listenTCP(t, hostV4, dnsPort)
	if out, err := s.exec(3*time.Second, tcpSend(remoteV4, "53")); err != nil {
		t.Fatalf("TCP 53 from the sandbox: %v\n%s", err, out)
	}
	acceptOrigDst(t, dnsTCP)
}

// testDropped: other ports, UDP and the host's other services fail at
// once: the sandbox's OUTPUT chain REJECTs them (a TCP reset, or EPERM for
// UDP) instead of letting connect() retry for minutes.
func (s *sandbox) testDropped(t *testing.T) {
	ssh := listenTCP(t, hostV4, "2222") // a host service the sandbox must not reach
	udp := listenUDP(t, hostV4, "9999")
	for _, c := range []struct{ remote, port string }{{remoteV4, "22"}, {remoteV6, "22"}, {hostV4, "2222"}, {remoteV4, "8443"}} {
		start := time.Now()
		out, err := s.exec(5*time.Second, tcpSend(c.remote, c.port))
		if err == nil {
			t.Errorf("connect %s port %s from the sandbox succeeded", c.remote, c.port)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("connect %s port %s took %v to fail, want a quick refusal: %s", c.remote, c.port, d, out)
		}
	}
	expectNoAccept(t, ssh, 200*time.Millisecond)
	s.exec(3*time.Second, udpSend(remoteV4, "9999"))
	s.exec(3*time.Second, udpSend(hostV4, "9999"))
	if received(udp, 500*time.Millisecond) {
		t.Error("a UDP packet from the sandbox reached the host")
	}
}

// testHostSideHolds plays a sandbox that is root in its namespace: it
// flushes its own rules. The host side must still refuse the host's other
// services and must route nothing onward, even with forwarding on in the
// host namespace (this throwaway one) and a host FORWARD rule that accepts
// everything, as Docker's does. The far namespace's counter shows whether
// anything left through the uplink. As a control, without the script's
// FORWARD jumps the same packets do arrive there. Then up repairs the
// sandbox's rules.
func (s *sandbox) testHostSideHolds(t *testing.T) {
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, args := range [][]string{{"-P", "OUTPUT", "ACCEPT"}, {"-P", "INPUT", "ACCEPT"}, {"-F"}, {"-X"}} {
			s.execOK(t, append([]string{tool, "-w"}, args...)...)
		}
	}
	writeFile(t, "/proc/sys/net/ipv4/ip_forward", "1")
	writeFile(t, "/proc/sys/net/ipv6/conf/all/forwarding", "1")
	ssh := listenTCP(t, hostV4, "2222")
	leak := func() {
		s.exec(3*time.Second, udpSend(remoteV4, "9999"))
		s.exec(3*time.Second, udpSend(remoteV6, "9999"))
		s.exec(time.Second, tcpSend(remoteV4, "22"))
	}

	sent := arrived(t)
	if _, err := s.exec(time.Second, tcpSend(hostV4, "2222")); err == nil {
		t.Error("with the sandbox's rules flushed, it reached a host service")
	}
	expectNoAccept(t, ssh, 200*time.Millisecond)
	leak()
	if now := arrived(t); now != sent {
		t.Fatalf("packets from the sandbox left through the uplink: %d -> %d", sent, now)
	}
	dropped := fwdDrops(t, s)
	if dropped == 0 {
		t.Error("the FORWARD drop counted no packets")
	}
	t.Logf("sandbox rules flushed, forwarding on: the FORWARD drop stopped %d packets, none left", dropped)

	// Control: the test would see a leak.
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, dir := range []string{"-i", "-o"} {
			run(t, tool, "-w", "-D", "FORWARD", dir, s.hostIf(), "-j", s.chain()+"-FWD")
		}
	}
	leak()
	now := arrived(t)
	if now == sent {
		t.Fatal("control failed: without the FORWARD drop nothing arrived either, so the check above proves nothing")
	}
	t.Logf("control: without the FORWARD jumps %d packets arrived beyond the uplink", now-sent)

	writeFile(t, "/proc/sys/net/ipv4/ip_forward", "0")
	writeFile(t, "/proc/sys/net/ipv6/conf/all/forwarding", "0")
	s.script(t, "up") // repairs the jumps and the sandbox's rules
	s.checkInstalled(t)
	if _, err := s.exec(3*time.Second, tcpSend(remoteV4, "22")); err == nil {
		t.Error("after up repaired the rules, port 22 connected")
	}
}

// checkRemoved: after down, the rules are as before up, and no namespace,
// link or resolv.conf remains.
func (s *sandbox) checkRemoved(t *testing.T, before string) {
	t.Helper()
	if after := ruleset(t); after != before {
		t.Errorf("rules after down differ from before up:\n--- before\n%s\n--- after\n%s", before, after)
	}
	if _, err := os.Stat("/run/netns/" + s.name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace %s still exists: %v", s.name, err)
	}
	if strings.Contains(output(t, "ip", "netns", "list"), s.name) {
		t.Errorf("ip netns list still has %s", s.name)
	}
	if links := output(t, "ip", "-br", "link"); strings.Contains(links, "egr-") {
		t.Errorf("links left behind:\n%s", links)
	}
	if _, err := os.Stat("/etc/netns/" + s.name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/etc/netns/%s still exists: %v", s.name, err)
	}
	if out, err := s.scriptErr("status"); err == nil {
		t.Errorf("status after down exits 0:\n%s", out)
	}
}

// exec runs a bash snippet in the sandbox namespace, killed after d.
func (s *sandbox) exec(d time.Duration, snippet string) (string, error) {
	secs := strconv.FormatFloat(d.Seconds(), 'f', 1, 64)
	out, err := exec.Command("ip", "netns", "exec", s.name, "timeout", secs, "bash", "-c", snippet).CombinedOutput()
	return string(out), err
}

func (s *sandbox) execOK(t *testing.T, args ...string) {
	t.Helper()
	run(t, "ip", append([]string{"netns", "exec", s.name}, args...)...)
}

// tcpSend and udpSend are bash snippets that send one line to host:port
// (bash's /dev/tcp and /dev/udp).
func tcpSend(host, port string) string {
	return fmt.Sprintf("echo hello >/dev/tcp/%s/%s", host, port)
}

func udpSend(host, port string) string {
	return fmt.Sprintf("echo hello >/dev/udp/%s/%s", host, port)
}

// fakeUplink gives the host namespace a default route, for both families,
// through up0, a veth whose peer is in the far namespace, with static
// neighbour entries for the gateways (the peer's MAC address, or the far
// end would discard the frames as meant for another host before any rule
// saw them) so no ARP or neighbour discovery muddies the count. In the far namespace a raw-table rule counts (and
// drops) every packet whose source is the sandbox's.
func fakeUplink(t *testing.T) {
	t.Helper()
	far := nsName("far")
	for _, args := range [][]string{
		{"link", "add", "up0", "type", "veth", "peer", "name", "up0p", "netns", far},
		{"addr", "add", "198.18.0.1/24", "dev", "up0"},
		{"-6", "addr", "add", "2001:db8:ffff::1/64", "dev", "up0", "nodad"},
		{"link", "set", "up0", "up"},
		{"-n", far, "link", "set", "up0p", "address", "02:00:00:00:00:02", "up"},
		{"neigh", "add", "198.18.0.2", "lladdr", "02:00:00:00:00:02", "dev", "up0", "nud", "permanent"},
		{"-6", "neigh", "add", "2001:db8:ffff::2", "lladdr", "02:00:00:00:00:02", "dev", "up0", "nud", "permanent"},
		{"route", "add", "default", "via", "198.18.0.2", "dev", "up0"},
		{"-6", "route", "add", "default", "via", "2001:db8:ffff::2", "dev", "up0"},
	} {
		run(t, "ip", args...)
	}
	run(t, "ip", "netns", "exec", far, "iptables", "-w", "-t", "raw", "-A", "PREROUTING", "-s", "10.200.7.0/30", "-j", "DROP")
	run(t, "ip", "netns", "exec", far, "ip6tables", "-w", "-t", "raw", "-A", "PREROUTING", "-s", "fd00:200:0:7::/64", "-j", "DROP")
}

// existingHostRules are rules a real host might have before up: an
// accept-everything FORWARD rule (Docker-like) and an ssh INPUT rule.
func existingHostRules(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"iptables", "ip6tables"} {
		run(t, tool, "-w", "-A", "FORWARD", "-j", "ACCEPT")
		run(t, tool, "-w", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
	}
}

// arrived counts the sandbox's packets that reached the far namespace.
func arrived(t *testing.T) int {
	t.Helper()
	far := nsName("far")
	total := 0
	for _, tool := range []string{"iptables", "ip6tables"} {
		total += dropCount(output(t, "ip", "netns", "exec", far, tool, "-w", "-t", "raw", "-L", "PREROUTING", "-v", "-x", "-n"))
	}
	return total
}

// fwdDrops is the packet count of the sandbox's FORWARD drop, both families.
func fwdDrops(t *testing.T, s *sandbox) int {
	t.Helper()
	total := 0
	for _, tool := range []string{"iptables", "ip6tables"} {
		total += dropCount(output(t, tool, "-w", "-L", s.chain()+"-FWD", "-v", "-x", "-n"))
	}
	return total
}

// dropCount sums the packet counters of the DROP rules in `iptables -L -v
// -x -n` output.
func dropCount(listing string) int {
	total := 0
	sc := bufio.NewScanner(strings.NewReader(listing))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 2 && f[2] == "DROP" {
			n, _ := strconv.Atoi(f[0])
			total += n
		}
	}
	return total
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// ruleset is iptables-save and ip6tables-save without comments and
// counters. A table holding nothing but its built-in chains with ACCEPT
// policies is left out: iptables creates it on first use, and it filters
// nothing, so it is the same as no table.
func ruleset(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		var table []string
		for _, line := range strings.Split(output(t, tool), "\n") {
			line = strings.TrimSpace(counters.ReplaceAllString(line, ""))
			switch {
			case line == "" || strings.HasPrefix(line, "#"):
			case strings.HasPrefix(line, "*"):
				table = []string{tool + " " + line}
			case line == "COMMIT":
				if !emptyTable(table) {
					b.WriteString(strings.Join(table, "\n") + "\n")
				}
			default:
				table = append(table, line)
			}
		}
	}
	return b.String()
}

func emptyTable(lines []string) bool {
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, ":") || !strings.HasSuffix(l, " ACCEPT") {
			return false
		}
	}
	return true
}

// listenTCP listens on host:port in the host namespace.
func listenTCP(t *testing.T, host, port string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func listenUDP(t *testing.T, host, port string) net.PacketConn {
	t.Helper()
	pc, err := net.ListenPacket("udp", net.JoinHostPort(host, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

// acceptOrigDst accepts one connection, checks it carries the line the
// sandbox sent, and returns its original destination.
func acceptOrigDst(t *testing.T, ln net.Listener) netip.AddrPort {
	t.Helper()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(3 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept on %s: %v", ln.Addr(), err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "hello\n" {
		t.Fatalf("read %q, %v; want hello", line, err)
	}
	orig, err := origdst.Get(c)
	if err != nil {
		t.Fatalf("origdst.Get: %v", err)
	}
	return orig
}

func expectNoAccept(t *testing.T, ln net.Listener, d time.Duration) {
	t.Helper()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(d))
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Errorf("%s accepted a connection from the sandbox", ln.Addr())
	}
}

// received reports whether pc got a packet within d.
func received(pc net.PacketConn, d time.Duration) bool {
	pc.SetReadDeadline(time.Now().Add(d))
	_, _, err := pc.ReadFrom(make([]byte, 64))
	return err == nil
}

func mustPort(s string) uint16 {
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		panic(err)
	}
	return uint16(p)
}

// requireTools skips the test unless it runs as root with every tool, or
// fails it when EGRESSD_REQUIRE_NETNS is set.
func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("needs %s (scripts/install-netns-deps.sh installs the tools)", strings.Join(missing, ", "))
	if os.Getenv("EGRESSD_REQUIRE_NETNS") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 2)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	output(t, name, args...)
}

func output(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func writeFile(t *testing.T, path, value string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestKubernetesInitRules runs deploy/kubernetes/egressd-init.sh (with sh,
// as the init image's busybox would) in a namespace standing for a pod's,
// whose default routes lead over a veth to a "far" namespace that counts
// what arrives. It checks the sidecar model end to end without egressd:
// the agent's (uid 1000) TCP 80/443 and DNS are REDIRECTed to listeners on
// loopback, which read the original destination; its other traffic and the
// admin and health ports are refused at once; egressd's own uid goes out
// untouched. The script runs with the init container's env from the manifest,
// so the hooks listener's port is open to the runtime's uid (and egressd's) only.
// Then it runs again beside rules like istio-init's (istioCoexistence).
func TestKubernetesInitRules(t *testing.T) {
	if !inNamespaces(t, []string{"pod", "far"}, nil) {
		return
	}
	far := nsName("far")
	run(t, "ip", "link", "set", "lo", "up")
	for _, args := range [][]string{
		{"link", "add", "eth0", "type", "veth", "peer", "name", "wire", "netns", far},
		{"addr", "add", "10.99.0.1/24", "dev", "eth0"},
		{"-6", "addr", "add", "fd99::1/64", "dev", "eth0", "nodad"},
		{"link", "set", "eth0", "up"},
		{"-n", far, "addr", "add", "10.99.0.2/24", "dev", "wire"},
		{"-n", far, "-6", "addr", "add", "fd99::2/64", "dev", "wire", "nodad"},
		{"-n", far, "link", "set", "wire", "up"},
		{"route", "add", "default", "via", "10.99.0.2"},
		{"-6", "route", "add", "default", "via", "fd99::2"},
	} {
		run(t, "ip", args...)
	}
	for tool, src := range map[string]string{"iptables": "10.99.0.1", "ip6tables": "fd99::1"} {
		for _, proto := range []string{"tcp", "udp"} {
			run(t, "ip", "netns", "exec", far, tool, "-w", "-t", "raw", "-A", "PREROUTING", "-s", src, "-p", proto, "-j", "DROP")
		}
	}
	initC := loadKubernetes(t).container(t, "egressd-init")
	initEnv := os.Environ()
	for _, e := range initC.Env {
		initEnv = append(initEnv, e.Name+"="+e.Value)
	}
	initRules := func() string {
		cmd := exec.Command("sh", "kubernetes/egressd-init.sh")
		cmd.Env = initEnv
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("egressd-init.sh: %v\n%s", err, out)
		}
		return ruleset(t)
	}
	if once, twice := initRules(), initRules(); once != twice {
		t.Fatalf("running egressd-init.sh twice changed the rules:\n--- once\n%s\n--- twice\n%s", once, twice)
	}

	// The listeners stand for egressd's: their sockets are egressd's uid's, the
	// only one the rules let answer from egressd's ports.
	tproxyPort, dnsPort := initValue(t, initC, "EGRESSD_TPROXY_PORT"), initValue(t, initC, "EGRESSD_DNS_PORT")
	adminPort, healthPort := initValue(t, initC, "EGRESSD_ADMIN_PORT"), initValue(t, initC, "EGRESSD_HEALTH_PORT")
	tproxy4, tproxy6 := listenTCPAs(t, egressdUID, "127.0.0.1", tproxyPort), listenTCPAs(t, egressdUID, "::1", tproxyPort)
	dnsUDP, dnsTCP := listenUDPAs(t, egressdUID, "127.0.0.1", dnsPort), listenTCPAs(t, egressdUID, "127.0.0.1", dnsPort)
	admin := listenTCPAs(t, egressdUID, "127.0.0.1", adminPort)
	health := listenTCPAs(t, egressdUID, "0.0.0.0", healthPort)
	hooksPort, runtimeUID := initValue(t, initC, "EGRESSD_HOOKS_PORT"), initValue(t, initC, "EGRESSD_RUNTIME_UID")
	hooksLn := listenTCPAs(t, egressdUID, "127.0.0.1", hooksPort)
	agent := func(d time.Duration, snippet string) error { return asUID(1000, d, snippet) }
	egressd := func(d time.Duration, snippet string) error { return asUID(egressdUID, d, snippet) }
	farCount := func() int {
		n := 0
		for _, tool := range []string{"iptables", "ip6tables"} {
			n += dropCount(output(t, "ip", "netns", "exec", far, tool, "-w", "-t", "raw", "-L", "PREROUTING", "-v", "-x", "-n"))
		}
		return n
	}

	t.Run("agent redirected", func(t *testing.T) {
		for _, c := range []struct {
			ln           net.Listener
			remote, port string
		}{{tproxy4, remoteV4, "443"}, {tproxy4, remoteV4, "80"}, {tproxy6, remoteV6, "443"}} {
			if err := agent(3*time.Second, tcpSend(c.remote, c.port)); err != nil {
				t.Fatalf("agent connect %s port %s: %v", c.remote, c.port, err)
			}
			want := netip.AddrPortFrom(netip.MustParseAddr(c.remote), mustPort(c.port))
			if got := acceptOrigDst(t, c.ln); got != want {
				t.Errorf("original destination %s, want %s", got, want)
			}
		}
		agent(3*time.Second, udpSend("10.96.0.10", "53")) // a cluster DNS address
		if !received(dnsUDP, time.Second) {
			t.Error("the agent's UDP 53 did not reach the DNS guard port")
		}
		if err := agent(3*time.Second, tcpSend("10.96.0.10", "53")); err != nil {
			t.Fatalf("agent TCP 53: %v", err)
		}
		acceptOrigDst(t, dnsTCP)
	})

	t.Run("agent refused", func(t *testing.T) {
		before := farCount()
		for _, c := range []struct{ remote, port string }{{remoteV4, "22"}, {remoteV6, "22"},
			{"127.0.0.1", adminPort}, {"127.0.0.1", healthPort}, {"10.99.0.1", healthPort}} {
			start := time.Now()
			if err := agent(5*time.Second, tcpSend(c.remote, c.port)); err == nil {
				t.Errorf("agent connected to %s port %s", c.remote, c.port)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("agent connect %s port %s took %v to fail", c.remote, c.port, d)
			}
		}
		expectNoAccept(t, admin, 200*time.Millisecond)
		expectNoAccept(t, health, 200*time.Millisecond)
		agent(3*time.Second, udpSend(remoteV4, "9999"))
		agent(3*time.Second, udpSend(remoteV6, "9999"))
		time.Sleep(200 * time.Millisecond)
		if after := farCount(); after != before {
			t.Errorf("%d packets from the agent left the pod", after-before)
		}
	})

	t.Run("egressd excluded", func(t *testing.T) {
		before := farCount()
		egressd(time.Second, tcpSend(remoteV4, "443")) // nobody answers out there: it times out
		egressd(time.Second, udpSend(remoteV4, "53"))
		expectNoAccept(t, tproxy4, 200*time.Millisecond)
		if received(dnsUDP, 200*time.Millisecond) {
			t.Error("egressd's own DNS query was redirected to the DNS guard")
		}
		if after := farCount(); after < before+2 {
			t.Errorf("egressd's own traffic did not leave the pod (%d -> %d packets)", before, after)
		}
		for _, ln := range []net.Listener{admin, health} {
			port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
			if err := egressd(3*time.Second, tcpSend("127.0.0.1", port)); err != nil {
				t.Errorf("egressd's uid cannot reach its port %s: %v", port, err)
			}
			ln.(*net.TCPListener).SetDeadline(time.Now().Add(3 * time.Second))
			if c, err := ln.Accept(); err != nil {
				t.Errorf("accept on %s: %v", port, err)
			} else {
				c.Close()
			}
		}
	})

	t.Run("hooks listener for the runtime only", func(t *testing.T) {
		hooksListenerChecks(t, hooksLn, hooksPort, runtimeUID)
	})

	t.Run("no squatter", func(t *testing.T) {
		kubernetesSquatter(t, initOwnPorts(initC), hooksPort, dnsPort, runtimeUID, hooksLn, dnsUDP, initRules)
	})

	t.Run("istio", func(t *testing.T) {
		istioCoexistence(t, initEnv, tproxy4, farCount)
	})
}

// hooksListenerChecks: with a hooks listener, only the agent runtime's uid and
// egressd's may connect to it; every other uid (the sandbox's, any other, root)
// is refused at once and the listener accepts nothing from them.
func hooksListenerChecks(t *testing.T, ln net.Listener, port, runtimeUID string) {
	uid, err := strconv.Atoi(runtimeUID)
	if err != nil {
		t.Fatalf("EGRESSD_RUNTIME_UID %q: %v", runtimeUID, err)
	}
	for _, other := range []int{1000, 4242, 0} {
		start := time.Now()
		if err := asUID(other, 3*time.Second, tcpSend("127.0.0.1", port)); err == nil {
			t.Errorf("uid %d connected to the hooks listener", other)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("uid %d: refused after %v, want at once", other, d)
		}
	}
	expectNoAccept(t, ln, 200*time.Millisecond)
	for _, allowed := range []int{uid, egressdUID} {
		if err := asUID(allowed, 3*time.Second, tcpSend("127.0.0.1", port)); err != nil {
			t.Errorf("uid %d cannot reach the hooks listener: %v", allowed, err)
			continue
		}
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(3 * time.Second))
		if c, err := ln.Accept(); err != nil {
			t.Errorf("hooks accept for uid %d: %v", allowed, err)
		} else {
			c.Close()
		}
	}
}

// initValue is the value of the init container's env name; the test needs it set.
func initValue(t *testing.T, c container, name string) string {
	t.Helper()
	v := envValue(c, name)
	if v == "" {
		t.Fatalf("egressd-init has no %s", name)
	}
	return v
}

// asUID runs a bash snippet as uid (and gid) uid, killed after d.
func asUID(uid int, d time.Duration, snippet string) error {
	id := strconv.Itoa(uid)
	secs := strconv.FormatFloat(d.Seconds(), 'f', 1, 64)
	return exec.Command("setpriv", "--reuid="+id, "--regid="+id, "--clear-groups", "--",
		"timeout", secs, "bash", "-c", snippet).Run()
}

// istioCoexistence: the pod also has Istio's rules, as istio-init appends them
// (nat OUTPUT -> ISTIO_OUTPUT: istio-proxy's uid and loopback RETURN, all other
// TCP REDIRECTed to Envoy's 15001), and egressd-init runs with
// EGRESSD_MESH_UID=1337. A listener of uid 1337 on 15001 stands for Envoy. The
// agent's HTTPS still reaches egressd and its other ports do not reach Envoy
// (Istio's REDIRECT is not a way around egressd); egressd's own upstream
// connections go through Envoy; Envoy's own are not sent back to egressd.
func istioCoexistence(t *testing.T, initEnv []string, tproxy4 net.Listener, farCount func() int) {
	const envoyPort = "15001"
	for _, r := range [][]string{
		{"-N", "ISTIO_OUTPUT"},
		{"-A", "ISTIO_OUTPUT", "-o", "lo", "-s", "127.0.0.6/32", "-j", "RETURN"},
		{"-A", "ISTIO_OUTPUT", "-m", "owner", "--uid-owner", strconv.Itoa(istioUID), "-j", "RETURN"},
		{"-A", "ISTIO_OUTPUT", "-m", "owner", "--gid-owner", strconv.Itoa(istioUID), "-j", "RETURN"},
		{"-A", "ISTIO_OUTPUT", "-d", "127.0.0.1/32", "-j", "RETURN"},
		{"-A", "ISTIO_OUTPUT", "-p", "tcp", "-j", "REDIRECT", "--to-ports", envoyPort},
		{"-A", "OUTPUT", "-p", "tcp", "-j", "ISTIO_OUTPUT"},
	} {
		run(t, "iptables", append([]string{"-w", "-t", "nat"}, r...)...)
	}
	t.Cleanup(func() {
		exec.Command("iptables", "-w", "-t", "nat", "-D", "OUTPUT", "-p", "tcp", "-j", "ISTIO_OUTPUT").Run()
		exec.Command("iptables", "-w", "-t", "nat", "-F", "ISTIO_OUTPUT").Run()
		exec.Command("iptables", "-w", "-t", "nat", "-X", "ISTIO_OUTPUT").Run()
	})
	cmd := exec.Command("sh", "kubernetes/egressd-init.sh")
	cmd.Env = append(slices.Clone(initEnv), "EGRESSD_MESH_UID="+strconv.Itoa(istioUID))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("egressd-init.sh with EGRESSD_MESH_UID: %v\n%s", err, out)
	}
	envoy := listenTCPAs(t, istioUID, "127.0.0.1", envoyPort)
	remote443 := netip.AddrPortFrom(netip.MustParseAddr(remoteV4), 443)

	if err := asUID(1000, 3*time.Second, tcpSend(remoteV4, "443")); err != nil {
		t.Fatalf("agent HTTPS with Istio's rules present: %v", err)
	}
	if got := acceptOrigDst(t, tproxy4); got != remote443 {
		t.Errorf("agent HTTPS reached egressd for %s, want %s", got, remote443)
	}
	if err := asUID(1000, 3*time.Second, tcpSend(remoteV4, "22")); err == nil {
		t.Errorf("the agent's port 22 connected: Istio's REDIRECT took it to Envoy, around egressd")
	}
	expectNoAccept(t, envoy, 200*time.Millisecond)

	if err := asUID(egressdUID, 3*time.Second, tcpSend(remoteV4, "443")); err != nil {
		t.Fatalf("egressd's upstream connection with Istio's rules present: %v", err)
	}
	if got := acceptOrigDst(t, envoy); got != remote443 {
		t.Errorf("egressd's upstream connection reached Envoy for %s, want %s (the mesh must see egressd's traffic)", got, remote443)
	}

	before := farCount()
	asUID(istioUID, time.Second, tcpSend(remoteV4, "443")) // nobody answers out there: it times out
	expectNoAccept(t, tproxy4, 200*time.Millisecond)
	if after := farCount(); after <= before {
		t.Errorf("Envoy's own connection did not leave the pod (%d -> %d packets): it was sent back to egressd or refused", before, after)
	}
}

package deploy_test

import (
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	nsutil "github.com/egressd/egressd/internal/netns"
)

// TestNetnsScriptNode brings a sandbox up and down with --node, in a throwaway
// host namespace as TestNetnsScript does, with a stand-in for the node egressd:
// the test itself reads the spec the script writes and opens the listeners
// inside the sandbox's namespace, where egressd would. test/node runs the script
// against the real egressd.
func TestNetnsScriptNode(t *testing.T) {
	requireTools(t, "ip", "iptables", "ip6tables", "jq", "ss")
	if !inNamespaces(t, []string{"host", "far"}, []string{"sandbox"}) {
		return
	}
	netnsScriptNodeChild(t)
}

// nodeSpec is the sandbox's part of its spec, as a platform would write it.
const nodeSpec = `{"environment": {"network": {"allowlist": [{"domain": "api.github.com"}]}}, "limits": {"max_connections": 64}}`

func netnsScriptNodeChild(t *testing.T) {
	dir := t.TempDir()
	sbxDir := filepath.Join(dir, "sandboxes.d")
	specIn := filepath.Join(dir, "spec.json")
	writeFile(t, specIn, nodeSpec)
	// The sandbox's ID is its name: lowercase.
	s := &sandbox{name: strings.ToLower(nsName("sandbox")), env: []string{
		"EGRESSD_NODE_SPEC=" + specIn, "EGRESSD_NODE_SANDBOXES_DIR=" + sbxDir, "EGRESSD_NODE_WAIT=30",
		"EGRESSD_NODE_CONFIG=" + filepath.Join(dir, "node.yaml"), "EGRESSD_BIN=" + filepath.Join(dir, "egressd")}}
	run(t, "ip", "link", "set", "lo", "up")
	fakeUplink(t)
	before := ruleset(t)
	specFile := filepath.Join(sbxDir, s.name+".json")

	t.Run("a spec egressd check refuses registers nothing", func(t *testing.T) {
		writeFile(t, filepath.Join(dir, "node.yaml"), "version: 1\n")
		os.WriteFile(filepath.Join(dir, "egressd"), []byte("#!/bin/sh\necho \"environment.network.allowlist[0].domain: stand-in problem ($*)\" >&2\nexit 1\n"), 0o755)
		out, err := s.scriptNode("up")
		if err == nil || !strings.Contains(out, "stand-in problem (check --config "+filepath.Join(dir, "node.yaml")+" --sandbox ") {
			t.Errorf("up --node with a refused spec: %v\n%s", err, out)
		}
		if names, _ := os.ReadDir(sbxDir); len(names) != 0 {
			t.Errorf("the sandboxes directory holds %v after a refused spec", names)
		}
		os.Remove(filepath.Join(dir, "node.yaml"))
	})

	lns := s.upNode(t, specFile)
	t.Run("redirected to the listeners inside", func(t *testing.T) { s.testRedirectedInside(t, lns) })
	t.Run("nothing else leaves", s.testNodeDropped)
	if out := s.script(t, "status"); strings.Contains(out, specFile) {
		t.Errorf("status without --node names the spec")
	}
	if out, err := s.scriptNode("status"); err != nil || !strings.Contains(out, specFile) || !strings.Contains(out, "egressd listens on 127.0.0.1:"+tproxyPort) {
		t.Errorf("status --node: %v\n%s", err, out)
	}
	s.downNode(t, specFile, lns)
	if out, err := s.scriptNode("down"); err != nil {
		t.Errorf("a second down --node: %v\n%s", err, out)
	}
	s.checkRemoved(t, before)
}

func (s *sandbox) scriptNode(cmd string) (string, error) {
	c := exec.Command(script, cmd, s.name, "--node")
	c.Env = append(append(os.Environ(), "EGRESSD_NETNS_INDEX="+index,
		"EGRESSD_TPROXY_PORT="+tproxyPort, "EGRESSD_DNS_PORT="+dnsPort), s.env...)
	out, err := c.CombinedOutput()
	return string(out), err
}

// nodeListeners stand for what egressd opens inside the sandbox.
type nodeListeners struct {
	tcp net.Listener
	dns net.PacketConn
}

// upNode runs up --node and plays egressd: once the spec appears, it checks it
// and opens the listeners it names inside the namespace. up must not return
// before they are open.
func (s *sandbox) upNode(t *testing.T, specFile string) *nodeListeners {
	t.Helper()
	type result struct {
		out string
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		out, err := s.scriptNode("up")
		done <- result{out, err, time.Now()}
	}()
	var spec struct {
		Netns     string `json:"netns"`
		Listeners []struct{ Name, Address, Mode string }
		DNS       struct{ Listen string }
		Limits    struct {
			MaxConnections int `json:"max_connections"`
		}
		Environment json.RawMessage
	}
	// up makes the namespace and its rules first: seconds on a loaded machine.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(specFile); err == nil {
			if err := json.Unmarshal(b, &spec); err != nil {
				t.Fatalf("%s: %v\n%s", specFile, err, b)
			}
			break
		}
		select {
		case r := <-done:
			t.Fatalf("up --node ended without writing %s: %v\n%s", specFile, r.err, r.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 60s", specFile)
		}
	}
	if spec.Netns != "/run/netns/"+s.name || len(spec.Listeners) != 1 || spec.Listeners[0].Address != "127.0.0.1:"+tproxyPort ||
		spec.Listeners[0].Mode != "transparent" || spec.DNS.Listen != "127.0.0.1:"+dnsPort || spec.Limits.MaxConnections != 64 ||
		!strings.Contains(string(spec.Environment), "api.github.com") {
		t.Errorf("the spec written: %+v", spec)
	}
	time.Sleep(300 * time.Millisecond) // up waits for the listener: it must still be waiting
	select {
	case r := <-done:
		t.Fatalf("up --node returned before egressd listened inside the sandbox: %v\n%s", r.err, r.out)
	default:
	}
	lns := &nodeListeners{}
	var err error
	if lns.tcp, err = nsutil.Listen(spec.Netns, "tcp", spec.Listeners[0].Address); err != nil {
		t.Fatal(err)
	}
	if lns.dns, err = nsutil.ListenPacket(spec.Netns, "udp", spec.DNS.Listen); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lns.tcp.Close(); lns.dns.Close() })
	r := <-done
	if r.err != nil || !strings.Contains(r.out, "registered with the node egressd") {
		t.Fatalf("up --node: %v\n%s", r.err, r.out)
	}
	return lns
}

// testRedirectedInside: TCP 80/443 to any address reaches the listener on the
// sandbox's own loopback with its original destination; DNS to any address
// reaches the DNS guard there.
func (s *sandbox) testRedirectedInside(t *testing.T, lns *nodeListeners) {
	for _, port := range []string{"443", "80"} {
		if out, err := s.exec(3*time.Second, tcpSend(remoteV4, port)); err != nil {
			t.Fatalf("connect %s port %s from the sandbox: %v\n%s", remoteV4, port, err, out)
		}
		want := netip.AddrPortFrom(netip.MustParseAddr(remoteV4), mustPort(port))
		if got := acceptOrigDst(t, lns.tcp); got != want {
			t.Errorf("original destination %s, want %s", got, want)
		}
	}
	s.exec(3*time.Second, udpSend(remoteV4, "53"))
	if !received(lns.dns, time.Second) {
		t.Error("UDP 53 to another address did not reach the DNS guard inside the sandbox")
	}
}

// testNodeDropped: nothing from the sandbox reaches the host or leaves it, not
// even the ports a sidecar's rules send to the host side, and other ports fail at
// once.
func (s *sandbox) testNodeDropped(t *testing.T) {
	host := listenTCP(t, hostV4, tproxyPort) // where a sidecar egressd would listen
	ssh := listenTCP(t, hostV4, "2222")
	for _, c := range []struct{ remote, port string }{{remoteV4, "22"}, {hostV4, "2222"}, {hostV4, tproxyPort}, {remoteV4, "8443"}, {remoteV6, "443"}} {
		start := time.Now()
		if out, err := s.exec(5*time.Second, tcpSend(c.remote, c.port)); err == nil {
			t.Errorf("connect %s port %s from the sandbox succeeded: %s", c.remote, c.port, out)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("connect %s port %s took %v to fail, want a quick refusal", c.remote, c.port, d)
		}
	}
	expectNoAccept(t, host, 200*time.Millisecond)
	expectNoAccept(t, ssh, 100*time.Millisecond)
	if n := arrived(t); n != 0 {
		t.Errorf("%d packets from the sandbox reached the far namespace", n)
	}
}

// downNode runs down --node and plays egressd again: once the spec is gone it
// closes the sandbox's listeners. down must wait for that before removing the
// namespace.
func (s *sandbox) downNode(t *testing.T, specFile string, lns *nodeListeners) {
	t.Helper()
	done := make(chan error, 1)
	var out string
	go func() {
		var err error
		out, err = s.scriptNode("down")
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(specFile); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there 10s into down --node", specFile)
		}
	}
	// egressd closes the listeners a moment later; until then the namespace stays.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat("/run/netns/" + s.name); err != nil {
			t.Fatalf("down --node removed the namespace while egressd still listened in it: %v", err)
		}
	}
	lns.tcp.Close()
	lns.dns.Close()
	if err := <-done; err != nil {
		t.Fatalf("down --node: %v\n%s", err, out)
	}
}

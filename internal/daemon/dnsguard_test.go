package daemon_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/daemon"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/syncbuf"
)

// guardAddr is where the DNS guard listens: an address a sinkhole may name
// (not loopback), on lo of the test's own network namespace.
const guardAddr = "10.53.0.1"

// TestDNSGuardRefusedNames: the daemon gives the DNS guard dns.refused_names.
// By default a name off the allowlist is answered with the guard's own
// address; with refuse it is REFUSED.
func TestDNSGuardRefusedNames(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		netns.AddLoopbackAddr(t, guardAddr+"/32")
		t.Run("default", func(t *testing.T) {
			resp := askGuard(t, startDaemon(t, ""), "evil.test.")
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != guardAddr {
				t.Fatalf("got %s, want the sinkhole %s", resp, guardAddr)
			}
		})
		t.Run("refuse", func(t *testing.T) {
			if resp := askGuard(t, startDaemon(t, "refuse"), "evil.test."); resp.Rcode != dns.RcodeRefused {
				t.Fatalf("got %s, want REFUSED", resp)
			}
		})
	})
}

// startDaemon starts a daemon with a DNS guard on guardAddr (dns.refused_names:
// refusedNames, unset when "") and returns the guard's address.
func startDaemon(t *testing.T, refusedNames string) string {
	t.Helper()
	dir := t.TempDir()
	dnsCfg := `listen: "` + guardAddr + `:0"`
	if refusedNames != "" {
		dnsCfg += ", refused_names: " + refusedNames
	}
	cfg := `version: 1
listeners: [{name: sandbox, address: "127.0.0.1:0"}]
admin: {address: "127.0.0.1:0"}
dns: {` + dnsCfg + `}
network: {resolver: "127.0.0.1:9"}
policy: {allowlist: [{domain: allowed.test}]}
credentials: {backend: file, file: credentials.json}
state_dir: state
`
	for name, data := range map[string]string{"egressd.yaml": cfg, "credentials.json": "{}\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "egressd.yaml")
	l, err := daemon.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	d := daemon.New(path, zerolog.New(logs), metrics.New())
	if err := d.Start(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	for _, line := range logs.Lines() {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["message"] == "listening" && m["listener"] == "dns" {
			return m["address"].(string)
		}
	}
	t.Fatalf("no DNS guard listening:\n%s", logs.Bytes())
	return ""
}

func askGuard(t *testing.T, addr, name string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	resp, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, addr)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

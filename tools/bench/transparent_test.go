package main

import (
	"context"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/testutil/netns"
)

// TestTransparentConfig: the transparent egressd's config loads, with an
// explicit listener named bench (startEgressd needs it), a transparent one on the
// veth's host side and the stand-in's name as its only entry.
func TestTransparentConfig(t *testing.T) {
	c, _ := loadConfig(t, transparentConfig("127.0.0.1:5353", "10.200.1.1"), map[string]string{credentialsFile: "{}\n"})
	modes := map[string]string{}
	for _, l := range c.Listeners {
		modes[l.Name] = l.Mode + " " + l.Address.String()
	}
	if modes["bench"] != "proxy 127.0.0.1:0" || modes["transparent"] != "transparent 10.200.1.1:15002" {
		t.Errorf("listeners %v", modes)
	}
	if len(c.Policy.Inline) != 1 || c.Policy.Inline[0].Domain != transparentHost {
		t.Errorf("allowlist %+v", c.Policy.Inline)
	}
}

// A transparent listener's spliced TLS logs status 0: an allowed line, not an
// unexpected one; a failed one stays unexpected.
func TestSplicedTLSIsAllowed(t *testing.T) {
	spliced := `{"level":"info","listener":"transparent","method":"","scheme":"tls","host":"tp.bench.test","decision":"allow","reason":"","detail":"","status":0,"error":"","message":"egress"}`
	failed := `{"level":"info","listener":"transparent","method":"","scheme":"tls","host":"tp.bench.test","decision":"error","reason":"upstream_unreachable","detail":"","status":0,"error":"dial tcp: refused","message":"egress"}`
	connect := `{"level":"info","method":"CONNECT","scheme":"connect","decision":"allow","reason":"","status":200,"error":"","message":"egress"}`
	var s logSummary
	for _, l := range []string{spliced, connect, spliced, failed} {
		s.add([]byte(l))
	}
	if s.EgressLines != 4 || s.Allowed200 != 3 || len(s.Unexpected) != 1 || len(s.Examples) != 1 || !strings.Contains(s.Examples[0], "upstream_unreachable") {
		t.Errorf("summary %+v", s)
	}
}

func TestAllowStandIn(t *testing.T) {
	for _, ok := range []string{"93.184.216.34:443", "127.0.0.1:8080"} {
		if err := allowStandIn(ok); err != nil {
			t.Errorf("allowStandIn(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"93.184.216.34:80", "93.184.216.35:443", "10.200.1.1:15002", "tp.bench.test:443"} {
		if allowStandIn(bad) == nil {
			t.Errorf("allowStandIn(%q) allowed it", bad)
		}
	}
}

// TestInsideRefusesHostNamespace: where lo is not the only interface, the path
// is not measured as the copy, whatever the environment says (here, with no
// egressd-netns in the working directory, it is skipped), and the copy's
// measure function refuses to run.
func TestInsideRefusesHostNamespace(t *testing.T) {
	if netns.Inside() {
		t.Skip("this test runs in a namespace with only lo")
	}
	t.Setenv(envBenchNetns, "1")
	if rows, err := measureTransparent(context.Background(), pathEnv{}); err != nil || len(rows) != 1 || rows[0].Skipped == "" {
		t.Errorf("measureTransparent in the host's namespace: %+v, %v", rows, err)
	}
	if _, err := measureTransparentInside(context.Background(), pathEnv{}); err == nil || !strings.Contains(err.Error(), "outside the loopback-only namespace") {
		t.Errorf("measureTransparentInside in the host's namespace: %v", err)
	}
}

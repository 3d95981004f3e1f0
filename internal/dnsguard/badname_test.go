package dnsguard_test

import (
	"encoding/json"
	"testing"

	"github.com/miekg/dns"
)

// TestBadNamesNeverForwarded: under the *.github.test entry, a question whose
// name is not a DNS name (allowlist.ValidateName, through NormalizeHost) is
// REFUSED with reason bad_name and never sent upstream, over UDP and TCP.
// Labels over 63 octets and names over 255 cannot be put on the wire at all;
// the proxy's test covers them. "_" is accepted and forwarded.
func TestBadNamesNeverForwarded(t *testing.T) {
	w := newWorld(t, nil)
	names := []string{
		"-a.github.test.", "a-.github.test.", "x.-b.github.test.", "a$b.github.test.",
		"a*b.github.test.", `a\032b.github.test.`, `a\.b.github.test.`,
	}
	for _, name := range names {
		for _, network := range []string{"udp", "tcp"} {
			for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
				wantRcode(t, w.ask(t, network, name, qtype), dns.RcodeRefused)
			}
		}
	}
	if n := w.upstream.Total(); n != 0 {
		t.Errorf("upstream saw %d queries for names that are not DNS names, want 0", n)
	}
	for i, line := range w.logs.Lines() {
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil || got["reason"] != "bad_name" {
			t.Errorf("log line %d: reason %v, want bad_name: %s", i, got["reason"], line)
		}
	}
	w.upstream.Set("_dmarc.github.test", "A 8.8.4.4")
	wantAddrs(t, w.ask(t, "udp", "_dmarc.github.test.", dns.TypeA), "8.8.4.4")
}

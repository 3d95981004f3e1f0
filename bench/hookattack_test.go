package main

import (
	"strings"
	"testing"
)

// The attack row's egressd gets its own limits.max_connections, below the
// attacker count, so the attack fills the listener.
func TestAttackConfigMaxConnections(t *testing.T) {
	if attackMaxConnections >= attackConns {
		t.Fatalf("attackMaxConnections %d must be below attackConns %d", attackMaxConnections, attackConns)
	}
	cfg, files := benchConfig(testUpstream(), "127.0.0.1:5353", nil, attackMaxConnections)
	if loaded, _ := loadConfig(t, cfg, files); loaded.Limits.MaxConnections != attackMaxConnections {
		t.Errorf("max_connections %d, want %d", loaded.Limits.MaxConnections, attackMaxConnections)
	}
}

// A row whose ordinary probe was served, or whose attack held fewer tunnels
// than the limit, is a problem: it did not measure the hook lane.
func TestAttackSummaryProblems(t *testing.T) {
	full := attackSummary{Conns: 200, MaxConnections: 128, HeldBefore: 150, ProbeStatus: 503}
	if p := full.problems(); len(p) != 0 {
		t.Errorf("full listener: %v", p)
	}
	served := full
	served.ProbeStatus = 200
	if p := served.problems(); len(p) != 1 || !strings.Contains(p[0], "not full") {
		t.Errorf("probe served: %v", p)
	}
	few := full
	few.HeldBefore = 100
	if p := few.problems(); len(p) != 1 || !strings.Contains(p[0], "fewer") {
		t.Errorf("few held: %v", p)
	}
}

// The attackers' own refusals leave the row's unexpected lines; anything else stays.
func TestTakeAttackLines(t *testing.T) {
	log := logSummary{Unexpected: map[string]int64{
		" : decision=error status=503 reason=overloaded":                                       3,
		"POST https: decision=deny status=200 reason=bad_request detail=body_timeout error=x":  2,
		"POST https: decision=error status=200 reason=overloaded detail=hook_lane_cut error=y": 1,
		"POST https: decision=error status=502 reason=upstream_error":                          4,
	}}
	var s attackSummary
	s.takeAttackLines(&log)
	if len(s.Refused) != 3 || len(log.Unexpected) != 1 {
		t.Errorf("refused %v, left %v", s.Refused, log.Unexpected)
	}
}

package main

import (
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/testutil/hookflood"
)

// A row whose ordinary probe was served, whose tunnels held fewer slots than
// the limit, whose flood fell short, or where a real call got no answer, has a
// problem saying so.
func TestAttackSummaryProblems(t *testing.T) {
	full := attackSummary{MaxConnections: 64, Held: 64, ProbeStatus: 503,
		Flood: hookflood.Stats{Begun: 6000, Seconds: 6}, Outcomes: map[string]int64{"allow": 10}}
	if p := full.problems(); len(p) != 0 {
		t.Errorf("full listener: %v", p)
	}
	for name, c := range map[string]struct {
		change func(*attackSummary)
		want   string
	}{
		"probe served":    {func(s *attackSummary) { s.ProbeStatus = 200 }, "not full"},
		"few held":        {func(s *attackSummary) { s.Held = 60 }, "fewer"},
		"flood short":     {func(s *attackSummary) { s.Flood.Begun = 3000 }, "fake calls a second"},
		"call unanswered": {func(s *attackSummary) { s.NotAnswered = 1 }, "got no answer"},
	} {
		s := full
		c.change(&s)
		if p := s.problems(); len(p) != 1 || !strings.Contains(p[0], c.want) {
			t.Errorf("%s: %v", name, p)
		}
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

package proxy

import "github.com/egressd/egressd/internal/membudget"

// HoldLane takes every free slot of the hook lane of each listener that has a
// connection open, with no connection behind them (none to cut), and returns
// the function that gives them back: what a lane looks like when newcomers
// have taken the slots a hook call freed by cutting.
func (s *Server) HoldLane() (release func()) {
	s.mu.Lock()
	lanes := map[chan struct{}]bool{}
	for c := range s.conns {
		lanes[c.l.lane] = true
	}
	s.mu.Unlock()
	var sems []chan struct{}
	for sem := range lanes {
		for takeSlot(sem, 0) {
			sems = append(sems, sem)
		}
	}
	return func() {
		for _, sem := range sems {
			<-sem
		}
	}
}

// OpenConns is how many spliced tunnels and upgraded connections are registered
// to be decided again on a change of state (tunnel.go).
func (s *Server) OpenConns() int { return s.live.len() }

// SetOverflowBound makes listeners served from now on hold at most n connections
// beyond limits.max_connections (awaitRoom), and returns the function that undoes it.
func SetOverflowBound(n int64) (restore func()) {
	overflowBoundFor = n
	return func() { overflowBoundFor = 0 }
}

// Admitting is how many connections are being admitted to a hook lane.
func (s *Server) Admitting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		if c.slot == slotAdmit {
			n++
		}
	}
	return n
}

// MaxHeadLines is maxHeadLines, for the external tests.
const MaxHeadLines = maxHeadLines

// SpendBudget takes from the memory budget all but room bytes, as a conns
// holding would, and returns the function that gives them back.
func (s *Server) SpendBudget(room int64) (restore func()) {
	n := max(s.mem.Room()-room, 0)
	s.mem.Take(membudget.Conns, n)
	return func() { s.mem.Release(membudget.Conns, n) }
}

// LaneCalls is how many hook lane connections have begun a hook call.
func (s *Server) LaneCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		if c.lane && c.laneRoot == c && c.inCall.Load() {
			n++
		}
	}
	return n
}

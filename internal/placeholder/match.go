package placeholder

import "bytes"

// matcher finds a policy's placeholders in bytes that arrive in pieces.
//
// Every placeholder begins with Prefix, so one bytes.Index for that fixed string (the
// runtime's vectorised search) finds every candidate, and comparing the few
// placeholders at a candidate names it. A multi-pattern automaton (the scrub
// package's) buys nothing when every pattern shares an 11-byte prefix, and the scrub
// Reader masks in place where a replacement changes lengths and must know which
// credential it met.
type matcher struct {
	phs    []string // sorted
	maxLen int
}

func newMatcher(phs []string) *matcher {
	m := &matcher{phs: phs}
	for _, ph := range phs {
		m.maxLen = max(m.maxLen, len(ph))
	}
	return m
}

// next returns the first placeholder in b at or after from (the longest, should one
// begin another): its offset and index in phs, or -1, -1.
func (m *matcher) next(b []byte, from int) (int, int) {
	for from < len(b) {
		i := bytes.Index(b[from:], []byte(Prefix))
		if i < 0 {
			return -1, -1
		}
		at, best := from+i, -1
		for k, ph := range m.phs {
			if bytes.HasPrefix(b[at:], []byte(ph)) && (best < 0 || len(ph) > len(m.phs[best])) {
				best = k
			}
		}
		if best >= 0 {
			return at, best
		}
		from = at + 1
	}
	return -1, -1
}

// hold returns the length of the longest suffix of b that is a proper prefix of a
// placeholder: the bytes a later read may still complete into one. It is shorter than
// the longest placeholder, and looks only at the bytes that begin like Prefix.
func (m *matcher) hold(b []byte) int {
	for i := max(0, len(b)-m.maxLen+1); i < len(b); i++ {
		j := bytes.IndexByte(b[i:], Prefix[0])
		if j < 0 {
			return 0
		}
		if i += j; m.properPrefix(b[i:]) {
			return len(b) - i
		}
	}
	return 0
}

// properPrefix reports whether s begins some longer placeholder.
func (m *matcher) properPrefix(s []byte) bool {
	if len(s) <= len(Prefix) {
		return len(m.phs) > 0 && Prefix[:len(s)] == string(s)
	}
	for _, ph := range m.phs {
		if len(s) < len(ph) && ph[:len(s)] == string(s) {
			return true
		}
	}
	return false
}

package config

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Problem is one finding about a config or policy, located by its path
// (listeners[1].address, network.allowlist[3].credential) and, when known,
// its file, line and column. Warnings do not make loading fail.
type Problem struct {
	Path    string `json:"path"`
	Line    int    `json:"line,omitempty"`
	Msg     string `json:"message"`
	Warning bool   `json:"warning,omitempty"`
	// File is set on problems of a file other than the config itself: the
	// policy file loaded through policy.file, or the file LoadPolicy read.
	File string `json:"file,omitempty"`
	// Column is set for syntax errors, where the line alone is too coarse.
	Column int `json:"column,omitempty"`
}

// String renders "path: message (file, line 7)"; warnings start with "warning: ".
func (p Problem) String() string {
	var b strings.Builder
	if p.Warning {
		b.WriteString("warning: ")
	}
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	if loc := p.location(); loc != "" {
		b.WriteString(" (" + loc + ")")
	}
	return b.String()
}

// location renders the file, line and column that are known.
func (p Problem) location() string {
	var parts []string
	if p.File != "" {
		parts = append(parts, p.File)
	}
	if p.Line > 0 {
		parts = append(parts, "line "+strconv.Itoa(p.Line))
	}
	if p.Column > 0 {
		parts = append(parts, "column "+strconv.Itoa(p.Column))
	}
	return strings.Join(parts, ", ")
}

// ValidationError lists every problem found in one load: errors first,
// then warnings, each group in file and line order. Every error Parse,
// ParsePolicy and their Load variants return for bad content is one.
type ValidationError struct {
	Problems []Problem
}

// Error renders "invalid configuration:" and one indented line per problem.
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("invalid configuration:")
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// problems collects findings while a document is decoded and validated.
// lines maps every path the decoder visited to its line, so that semantic
// checks made later on raw values still point into the file.
type problems struct {
	list    []Problem
	dropped int
	lines   map[string]int
	file    string // set on every problem added
	// suggested holds the paths that "did you mean" messages point at.
	suggested map[string]bool
}

func newProblems() *problems {
	return &problems{lines: map[string]int{}, suggested: map[string]bool{}}
}

// errorf records an error at path, on the line recorded for path or its
// nearest ancestor, unless an error is already recorded at, above or under
// path, or an unknown key's suggestion already points at path: a key that
// failed to decode, or was misspelt, is not also reported as missing.
func (ps *problems) errorf(path, format string, args ...any) {
	if ps.hasError(path, true) || ps.suggested[path] {
		return
	}
	ps.add(Problem{Path: path, Line: ps.lineOf(path), Msg: fmt.Sprintf(format, args...)})
}

// warnf records a warning at path.
func (ps *problems) warnf(path, format string, args ...any) {
	ps.add(Problem{Path: path, Line: ps.lineOf(path), Msg: fmt.Sprintf(format, args...), Warning: true})
}

// add records p, keeping at most maxProblems.
func (ps *problems) add(p Problem) {
	if p.File == "" {
		p.File = ps.file
	}
	if len(ps.list) >= maxProblems {
		ps.dropped++
		return
	}
	ps.list = append(ps.list, p)
}

// hasError reports whether an error is recorded at path or an ancestor of
// it, or (with descendants) at a path under it.
func (ps *problems) hasError(path string, descendants bool) bool {
	for _, p := range ps.list {
		if p.Warning {
			continue
		}
		if isWithin(path, p.Path) || descendants && isWithin(p.Path, path) {
			return true
		}
	}
	return false
}

// isWithin reports whether path equals root or lies under it.
func isWithin(path, root string) bool {
	if root == "" || path == root {
		return true
	}
	return strings.HasPrefix(path, root) && (path[len(root)] == '.' || path[len(root)] == '[')
}

// setLine records where path is, keeping the first record.
func (ps *problems) setLine(path string, line int) {
	if _, ok := ps.lines[path]; !ok && line > 0 {
		ps.lines[path] = line
	}
}

// lineOf returns the line of path, or of its nearest recorded ancestor
// ("a.b[2].c", then "a.b[2]", "a.b", "a"); 0 when none is known.
func (ps *problems) lineOf(path string) int {
	for path != "" {
		if l, ok := ps.lines[path]; ok {
			return l
		}
		path = parentPath(path)
	}
	return 0
}

// parentPath strips the last ".key" or "[i]" segment.
func parentPath(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

// count returns the number of errors (not warnings) recorded so far.
func (ps *problems) count() int {
	n := ps.dropped
	for _, p := range ps.list {
		if !p.Warning {
			n++
		}
	}
	return n
}

// warnings returns the recorded warnings in order.
func (ps *problems) warnings() []Problem {
	var ws []Problem
	for _, p := range sorted(ps.list) {
		if p.Warning {
			ws = append(ws, p)
		}
	}
	return ws
}

// err returns a *ValidationError holding every problem when at least one
// is an error, else nil.
func (ps *problems) err() error {
	if ps.count() == 0 {
		return nil
	}
	list := sorted(ps.list)
	if ps.dropped > 0 {
		list = append(list, Problem{Msg: fmt.Sprintf("%d more problems not shown; fix these first", ps.dropped)})
	}
	return &ValidationError{Problems: list}
}

// merge appends other's problems (used when the policy file's problems join
// the config's).
func (ps *problems) merge(other *problems) {
	for _, p := range other.list {
		ps.add(p)
	}
	ps.dropped += other.dropped
}

// sorted orders problems errors first, then by file (the config itself
// first), then by line (problems without one, such as missing sections,
// last), keeping discovery order otherwise.
func sorted(list []Problem) []Problem {
	out := slices.Clone(list)
	slices.SortStableFunc(out, func(a, b Problem) int {
		if a.Warning != b.Warning {
			if a.Warning {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(sortLine(a.Line), sortLine(b.Line)))
	})
	return out
}

// sortLine puts line 0 (unknown) after every real line.
func sortLine(l int) int {
	if l <= 0 {
		return math.MaxInt
	}
	return l
}

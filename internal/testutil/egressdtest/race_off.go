//go:build !race

package egressdtest

// RaceEnabled reports whether this binary was built with -race.
const RaceEnabled = false

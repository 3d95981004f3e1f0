//go:build !race

package conformance_test

// raceEnabled: the suite was built without -race.
const raceEnabled = false

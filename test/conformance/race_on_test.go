//go:build race

package conformance_test

// raceEnabled: the suite was built with -race, so egressd is built with it too.
const raceEnabled = true

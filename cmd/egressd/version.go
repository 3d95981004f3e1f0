package main

import (
	"fmt"
	"runtime"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

func cmdVersion([]string) int {
	fmt.Printf("egressd %s (commit %s, %s)\n", version, commit, runtime.Version())
	return exitOK
}

package main

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/egressd/egressd/internal/daemon"
)

const sandboxUsage = `usage: egressd sandbox env [--config FILE]

  print NAME=<placeholder> for every variable of the policy's "env" section that names a
  credential: what the sandbox's environment gets instead of the secret
`

func cmdSandbox(args []string) int {
	if len(args) == 0 || args[0] != "env" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(os.Stdout, sandboxUsage)
			return exitOK
		}
		fmt.Fprint(stderr, sandboxUsage)
		return exitUsage
	}
	fs, cfgPath, _ := newFlags("sandbox env", stderr)
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "egressd: sandbox env takes no arguments, got %q\n", fs.Args())
		return exitUsage
	}
	l, err := daemon.Load(*cfgPath)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	r, err := daemon.Placeholders(l, nil)
	if err != nil {
		fmt.Fprintf(stderr, "egressd: %v\n", err)
		return exitRuntime
	}
	printEnv(os.Stdout, r.Env())
	return exitOK
}

// printEnv writes one unquoted NAME=value line per variable, sorted by name.
func printEnv(w io.Writer, env map[string]string) {
	names := make([]string, 0, len(env))
	for n := range env {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "%s=%s\n", n, env[n])
	}
}

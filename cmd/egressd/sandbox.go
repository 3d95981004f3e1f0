package main

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/egressd/egressd/internal/placeholder"
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
	l, err := load(*cfgPath)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	r, err := placeholders(l, nil)
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

// placeholders builds the policy's placeholder replacer (nil when its env section names no
// credential), loading or creating the derivation key in state_dir.
func placeholders(l *loaded, creds placeholder.Credentials) (*placeholder.Replacer, error) {
	if len(l.policy.Env) == 0 {
		return nil, nil
	}
	key, err := placeholder.LoadKey(l.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return placeholder.New(key, l.cfg.Environment, l.policy.Env, nil, creds), nil
}

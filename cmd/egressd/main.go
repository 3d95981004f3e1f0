// Command egressd is the egress proxy for AI-agent sandboxes: run, check, explain, version.
package main

import (
	"fmt"
	"os"
)

// Exit codes, which scripts and supervisors act on: a usage error is not worth
// a restart, a runtime failure may be.
const (
	exitOK      = 0
	exitUsage   = 1 // validation or usage error, with a message
	exitRuntime = 2 // runtime failure
)

const usage = `usage: egressd <command> [flags]

commands:
  run      [--config FILE] [--no-supervise]
                                           serve (quick-start defaults without --config): a
                                           parent holds the sockets, a worker serves them
  check    [--config FILE] [--format json] validate config and policy; exit 1 on any error
  explain  [--config FILE] [--format json] URL
                                           print the decision for URL, offline
  ca init  [--config FILE]                 create the interception CA (state_dir) if absent
  ca env   [--config FILE] [--format json] print the CA path and client variables (merged bundle)
  sandbox env [--config FILE]              print NAME=<placeholder> for the policy's env section
  version                                  version, commit, Go version
`

func main() {
	os.Exit(runMain(os.Args[1:]))
}

func runMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return exitUsage
	}
	cmds := map[string]func([]string) int{
		"run": cmdRun, "check": cmdCheck, "explain": cmdExplain, "version": cmdVersion, "ca": cmdCA,
		"sandbox": cmdSandbox,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			fmt.Fprint(os.Stdout, usage)
			return exitOK
		}
		fmt.Fprintf(os.Stderr, "egressd: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	return cmd(args[1:])
}

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/egressd/egressd/internal/daemon"
	mitm "github.com/egressd/egressd/internal/tls"
)

const caUsage = `usage: egressd ca <command> [--config FILE] [--format json]

commands:
  init   create the interception CA in state_dir (or check tls.ca_cert and tls.ca_key)
         and write its public files into tls.ca_public_dir (default state_dir/ca): the
         CA certificate, the merged bundle (system roots + CA) and a PKCS#12 trust store
  env    print the environment that makes common clients trust egressd:
         eval "$(egressd ca env)"
`

// caFiles is what both ca commands produce: the CA and its public files.
type caFiles struct {
	ca      *mitm.CA
	created bool
	pub     mitm.Public
}

// cmdCA runs `egressd ca init` and `egressd ca env`.
func cmdCA(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, caUsage)
		return exitUsage
	}
	switch args[0] {
	case "init":
		return runCA("ca init", args[1:], printCAInit)
	case "env":
		return runCA("ca env", args[1:], printCAEnv)
	case "-h", "--help", "help":
		fmt.Fprint(os.Stdout, caUsage)
		return exitOK
	}
	fmt.Fprintf(stderr, "egressd: unknown ca command %q\n\n%s", args[0], caUsage)
	return exitUsage
}

// runCA parses the flags, loads the config, loads or creates the CA, writes the
// bundle and hands the result to print.
func runCA(name string, args []string, print func(w io.Writer, f caFiles, json bool) error) int {
	fs, cfgPath, format := newFlags(name, stderr)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "egressd: %s takes no arguments, got %q\n", name, fs.Args())
		return exitUsage
	}
	if *format != "text" && *format != "json" {
		fmt.Fprintf(stderr, "egressd: --format must be text or json, got %q\n", *format)
		return exitUsage
	}
	l, err := daemon.Load(*cfgPath)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	f, code := caSetup(l)
	if code != exitOK {
		return code
	}
	if err := print(os.Stdout, f, *format == "json"); err != nil {
		fmt.Fprintf(stderr, "egressd: %v\n", err)
		return exitRuntime
	}
	return exitOK
}

// caSetup loads (or generates) the CA the config names and writes the bundle
// into the state dir. A CA that exists but cannot be used is a validation
// error; failing to read or write files is a runtime failure.
func caSetup(l *daemon.Loaded) (caFiles, int) {
	cfg := l.Cfg
	ca, created, err := mitm.LoadOrCreateCA(cfg.TLS.CACert, cfg.TLS.CAKey, cfg.StateDir, cfg.Environment)
	if err != nil {
		fmt.Fprintf(stderr, "egressd: %v\n", err)
		if errors.Is(err, mitm.ErrInvalidCA) {
			return caFiles{}, exitUsage
		}
		return caFiles{}, exitRuntime
	}
	pub, err := mitm.WritePublic(ca, cfg.TLS.CAPublicDir, cfg.StateDir)
	if err != nil {
		fmt.Fprintf(stderr, "egressd: %v\n", err)
		return caFiles{}, exitRuntime
	}
	return caFiles{ca: ca, created: created, pub: pub}, exitOK
}

func printCAInit(w io.Writer, f caFiles, asJSON bool) error {
	if asJSON {
		return writeJSON(w, struct {
			CA         string `json:"ca"`
			Created    bool   `json:"created"`
			Public     string `json:"public_ca"`
			Bundle     string `json:"bundle"`
			TrustStore string `json:"trust_store"`
		}{f.ca.CertFile, f.created, f.pub.Cert, f.pub.Bundle, f.pub.TrustStore})
	}
	if f.created {
		fmt.Fprintf(w, "created CA %s\n", f.ca.CertFile)
	} else {
		fmt.Fprintf(w, "CA exists at %s\n", f.ca.CertFile)
	}
	_, err := fmt.Fprintf(w, "wrote %s, %s and %s (readable by every user)\n", f.pub.Cert, f.pub.Bundle, f.pub.TrustStore)
	return err
}

// printCAEnv prints the client environment as shell `export` lines, or as
// {"ca", "bundle", "env"} JSON. A CA it had to create is announced on stderr,
// so stdout stays fit for eval.
func printCAEnv(w io.Writer, f caFiles, asJSON bool) error {
	if f.created {
		fmt.Fprintf(stderr, "egressd: created CA %s\n", f.ca.CertFile)
	}
	env := mitm.ClientEnv(f.pub)
	if asJSON {
		m := make(map[string]string, len(env))
		for _, kv := range env {
			name, value, _ := strings.Cut(kv, "=")
			m[name] = value
		}
		return writeJSON(w, struct {
			CA         string            `json:"ca"`
			Bundle     string            `json:"bundle"`
			TrustStore string            `json:"trust_store"`
			Env        map[string]string `json:"env"`
		}{f.pub.Cert, f.pub.Bundle, f.pub.TrustStore, m})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# egressd CA: %s (every user can read the files named below)\n", f.pub.Cert)
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "export %s=%s\n", name, shellQuote(value))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// shellQuote single-quotes s for POSIX shells. Inside single quotes only a
// quote is special: it closes the string, adds an escaped quote and reopens.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

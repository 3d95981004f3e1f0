package config

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
)

// Golden tests, in the manner of Caddy's: every testdata/golden/NAME.yaml is
// an operator config and every testdata/golden/NAME.json a policy; NAME.golden
// holds what loading it gives, either the rendering of the validated result
// (render below) or the exact error text. `go test ./internal/config -update`
// rewrites the golden files; review the diff.
//
// A config may start with comment lines "# env: KEY=VALUE" to set an
// environment variable for its case; VAULT_ADDR and VAULT_TOKEN are cleared
// otherwise. Configs are parsed with baseDir testdata/golden, so the
// policy files they name are golden cases of their own.

var update = flag.Bool("update", false, "rewrite the golden files")

const goldenDir = "testdata/golden"

// goldenPolicyOptions are the options every golden policy compiles with.
var goldenPolicyOptions = allowlist.Options{DefaultPorts: []uint16{80, 443}, Intercept: allowlist.InterceptAuto}

func TestGoldenConfigs(t *testing.T) {
	inputs, _ := filepath.Glob(filepath.Join(goldenDir, "*.yaml"))
	if len(inputs) == 0 {
		t.Fatal("no golden configs")
	}
	// The shipped configs are golden cases too, parsed from configs/.
	shipped := map[string]string{
		"../../configs/quickstart.yaml": filepath.Join(goldenDir, "shipped_quickstart.golden"),
		"../../configs/dev-local.yaml":  filepath.Join(goldenDir, "shipped_dev-local.golden"),
		"../../configs/vault.yaml":      filepath.Join(goldenDir, "shipped_vault.golden"),
	}
	for _, in := range inputs {
		shipped[in] = strings.TrimSuffix(in, ".yaml") + ".golden"
	}
	for in, golden := range shipped {
		t.Run(filepath.Base(in), func(t *testing.T) {
			data := readTestFile(t, in)
			setGoldenEnv(t, data)
			cfg, err := Parse(data, filepath.Dir(in))
			checkGolden(t, golden, renderResult(cfg, err))
		})
	}
}

func TestGoldenPolicies(t *testing.T) {
	inputs, _ := filepath.Glob(filepath.Join(goldenDir, "*.json"))
	if len(inputs) == 0 {
		t.Fatal("no golden policies")
	}
	for _, in := range inputs {
		t.Run(filepath.Base(in), func(t *testing.T) {
			pol, err := ParsePolicy(readTestFile(t, in), goldenPolicyOptions)
			checkGolden(t, strings.TrimSuffix(in, ".json")+".golden", renderResult(pol, err))
		})
	}
}

// setGoldenEnv clears the Vault variables, then applies "# env:" lines.
func setGoldenEnv(t *testing.T, data []byte) {
	t.Setenv("VAULT_ADDR", "")
	t.Setenv("VAULT_TOKEN", "")
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		kv, ok := strings.CutPrefix(sc.Text(), "# env: ")
		if !ok {
			break
		}
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// renderResult renders a successful result, or the error's text. An error
// must be a *ValidationError.
func renderResult(v any, err error) string {
	if err != nil {
		var ve *ValidationError
		if !errors.As(err, &ve) {
			return "NOT A *ValidationError: " + err.Error() + "\n"
		}
		return "error:\n" + err.Error() + "\n"
	}
	var b strings.Builder
	render(&b, "", reflect.ValueOf(v))
	return b.String()
}

// render writes one "path: value" line per leaf of v: a stable text form
// of the validated types, so a golden diff shows exactly what changed.
func render(b *strings.Builder, path string, v reflect.Value) {
	if v.IsValid() && v.CanInterface() {
		if s, ok := renderLeaf(v.Interface()); ok {
			fmt.Fprintf(b, "%s: %s\n", path, s)
			return
		}
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			fmt.Fprintf(b, "%s: nil\n", path)
			return
		}
		render(b, path, v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			if !v.Type().Field(i).IsExported() {
				continue // what the config was read from, not what it says
			}
			render(b, joinField(path, v.Type().Field(i).Name), v.Field(i))
		}
	case reflect.Slice:
		if v.Len() == 0 {
			fmt.Fprintf(b, "%s: []\n", path)
		}
		for i := range v.Len() {
			render(b, fmt.Sprintf("%s[%d]", path, i), v.Index(i))
		}
	case reflect.String:
		fmt.Fprintf(b, "%s: %q\n", path, v.String())
	default:
		fmt.Fprintf(b, "%s: %v\n", path, v.Interface())
	}
}

// renderLeaf renders the types that print as one value.
func renderLeaf(x any) (string, bool) {
	switch x := x.(type) {
	case time.Duration, netip.AddrPort, netip.Prefix:
		return fmt.Sprint(x), true
	case []uint16:
		return fmt.Sprint(x), true
	case Problem:
		return x.String(), true
	case allowlist.Entry:
		var hs []string
		for _, h := range x.Transform {
			hs = append(hs, h.Name+"="+h.Value)
		}
		return fmt.Sprintf("domain=%q ports=%v transform=%v credential=%q allow_plaintext=%v",
			x.Domain, x.Ports, hs, x.Credential, x.AllowPlaintext), true
	case json.RawMessage:
		if x == nil {
			return "none", true
		}
		return fmt.Sprintf("%q", string(x)), true
	case *allowlist.Policy:
		if x == nil {
			return "nil", true
		}
		var rules []string
		for _, r := range x.Rules() {
			rules = append(rules, fmt.Sprintf("%s ports=%v injects=%v", r.Pattern, r.Ports, r.Injects()))
		}
		return "[" + strings.Join(rules, "; ") + "]", true
	}
	return "", false
}

func joinField(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func readTestFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// checkGolden compares got with the golden file, or rewrites it (-update).
func checkGolden(t *testing.T, golden, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update to accept):\n--- got\n%s\n--- want\n%s", golden, got, want)
	}
}

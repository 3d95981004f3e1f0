// Package docs holds egressd's user reference; its tests keep the reference true
// to the code: every config key, reason code, metric and log field the code
// defines must be named in docs/, and no user-facing page may point at a file that
// is not in the repository.
package docs

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
)

// named fails t for every name that page does not mention as `name`.
func named(t *testing.T, page string, names []string, what string) {
	t.Helper()
	doc, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatalf("found no %s in the code: the test no longer reads it right", what)
	}
	for _, n := range names {
		if !strings.Contains(string(doc), "`"+n+"`") {
			t.Errorf("%s %q is not documented in docs/%s (write it as `%s`)", what, n, page, n)
		}
	}
}

func TestEveryConfigKeyDocumented(t *testing.T) {
	named(t, "configuration.md", config.Keys(), "config key")
}

func TestEveryEntryKeyDocumented(t *testing.T) {
	named(t, "policy.md", config.EntryKeys(), "allowlist entry key")
}

func TestEveryReasonDocumented(t *testing.T) {
	named(t, "reasons.md", reasonCodes(t, "../internal/allowlist", "Reason"), "reason code")
}

// TestReasonTableIsTheList: the reason table of reasons.md has one row per code of
// allowlist.Reasons (the list metrics exports and explain answers with), in its order.
func TestReasonTableIsTheList(t *testing.T) {
	doc, err := os.ReadFile("reasons.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(doc), "| reason | status |")
	table, _, _ = strings.Cut(table, "\n\n")
	var rows []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(table, -1) {
		rows = append(rows, m[1])
	}
	var want []string
	for _, r := range allowlist.Reasons {
		want = append(want, string(r))
	}
	if !slices.Equal(rows, want) {
		t.Errorf("reasons.md's table lists %v, want allowlist.Reasons: %v", rows, want)
	}
}

func TestEveryDNSGuardReasonDocumented(t *testing.T) {
	named(t, "reasons.md", reasonCodes(t, "../internal/dnsguard", "reason"), "DNS guard reason")
}

func TestEveryMetricDocumented(t *testing.T) {
	named(t, "observability.md", metricNames(t, ".."), "metric")
}

func TestEveryLogFieldDocumented(t *testing.T) {
	src, err := os.ReadFile("../internal/proxy/record.go")
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	for _, m := range regexp.MustCompile(`\.(?:Str|Strs|Bool|Int|Int64|Uint16)\("([a-z_]+)"`).FindAllSubmatch(src, -1) {
		fields = append(fields, string(m[1]))
	}
	named(t, "observability.md", fields, "log field")
}

// reasonCodes reads the string values of the constants of type typ in dir: a
// constant declared `X typ = "code"` or `X = typ("code")`.
func reasonCodes(t *testing.T, dir, typ string) []string {
	t.Helper()
	files, err := filepath.Glob(dir + "/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if vs, ok := n.(*ast.ValueSpec); ok && len(vs.Values) == 1 {
				if s := constOf(vs, typ); s != "" {
					codes = append(codes, s)
				}
			}
			return true
		})
	}
	return codes
}

// constOf is the string a constant of type typ is declared with, or "".
func constOf(vs *ast.ValueSpec, typ string) string {
	lit, ok := vs.Values[0].(*ast.BasicLit)
	if id, isIdent := vs.Type.(*ast.Ident); !ok || !isIdent || id.Name != typ {
		call, isCall := vs.Values[0].(*ast.CallExpr) // typ("code")
		if !isCall || len(call.Args) != 1 {
			return ""
		}
		if fn, isIdent := call.Fun.(*ast.Ident); !isIdent || fn.Name != typ {
			return ""
		}
		if lit, ok = call.Args[0].(*ast.BasicLit); !ok {
			return ""
		}
	}
	s, _ := strconv.Unquote(lit.Value)
	return s
}

// metricNames are the metric names registered anywhere under root's internal/
// (a `Name: "egressd_..."` in a collector's options), for this test and the
// dashboard test in deploy/.
func metricNames(t *testing.T, root string) []string {
	t.Helper()
	re := regexp.MustCompile(`Name:\s*"(egressd_[a-z0-9_]+)"`)
	seen := map[string]bool{}
	var names []string
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		for _, m := range re.FindAllSubmatch(src, -1) {
			if n := string(m[1]); !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestNoDanglingDesignLinks: the README and deploy/ READMEs are what a user reads
// from a clone; the design notes are not in it, so they point at docs/ instead.
func TestNoDanglingDesignLinks(t *testing.T) {
	pages, _ := filepath.Glob("../deploy/*/README.md")
	pages = append(pages, "../README.md")
	pages = append(pages, mdPages(t)...)
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "DESIGN.md") {
			t.Errorf("%s mentions DESIGN.md, which is not in the repository: link docs/ instead", p)
		}
	}
	readme, _ := os.ReadFile("../README.md")
	for _, p := range mdPages(t) {
		if !strings.Contains(string(readme), "docs/"+filepath.Base(p)) {
			t.Errorf("README.md does not link docs/%s", filepath.Base(p))
		}
	}
}

func mdPages(t *testing.T) []string {
	pages, err := filepath.Glob("*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs pages: %v", err)
	}
	return pages
}

// TestObservabilityNamesRealMetrics: the dashboard and the alert rules in
// deploy/observability name only metrics egressd exports (a histogram's _bucket,
// _sum and _count included), parse as JSON and YAML, and cover what an operator
// must watch.
func TestObservabilityNamesRealMetrics(t *testing.T) {
	known := map[string]bool{}
	for _, n := range metricNames(t, "..") {
		for _, s := range []string{"", "_bucket", "_sum", "_count"} {
			known[n+s] = true
		}
	}
	dash := readFile(t, "../deploy/observability/egressd-dashboard.json")
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(dash, &d); err != nil || len(d.Panels) == 0 {
		t.Fatalf("dashboard: %v (%d panels)", err, len(d.Panels))
	}
	rules := readFile(t, "../deploy/observability/egressd-alerts.yaml")
	var r struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(rules, &r); err != nil || len(r.Groups) == 0 {
		t.Fatalf("alert rules: %v", err)
	}
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			if rule.Alert == "" || rule.Expr == "" || rule.Labels["severity"] == "" || rule.Annotations["summary"] == "" {
				t.Errorf("alert %q lacks an expr, a severity or a summary", rule.Alert)
			}
			exprs = append(exprs, rule.Expr)
		}
	}
	all := strings.Join(exprs, "\n")
	for _, m := range regexp.MustCompile(`egressd_[a-z0-9_]+`).FindAllString(all, -1) {
		if !known[m] {
			t.Errorf("deploy/observability names %s, which egressd does not export", m)
		}
	}
	for _, must := range []string{`egressd_requests_total{decision="deny"`, "egressd_credential_age_seconds", "egressd_credential_ready",
		`outcome="failed_closed"`, `egressd_config_reloads_total{result="error"}`, `reason="overloaded"`, "egressd_scrubbed_total"} {
		if !strings.Contains(all, must) {
			t.Errorf("deploy/observability does not watch %s", must)
		}
	}
	if !strings.Contains(all, `outcome="failed_closed"`) || !strings.Contains(string(readFile(t, "../internal/proxy/hookcall.go")), `"failed_closed"`) {
		t.Error(`the fail-closed outcome label is no longer "failed_closed": update the dashboard and the alerts`)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

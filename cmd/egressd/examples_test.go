package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestExampleConfigsCheck: every example config a user copies (configs/*.yaml and
// the `version: 1` YAML blocks of docs/) passes `egressd check`, and every warning
// it prints is one the file explains with a comment `# check warns: <part of the
// message>`: a shipped config that warns for no stated reason teaches operators to
// ignore warnings. Docs blocks run as if saved in configs/ (beside links to its
// files), since relative paths resolve against the config file's directory.
func TestExampleConfigsCheck(t *testing.T) {
	examples, _ := filepath.Glob("../../configs/*.yaml")
	examples = append(examples, docsExamples(t)...)
	if len(examples) < 4 {
		t.Fatalf("found only %d example configs", len(examples))
	}
	for _, path := range examples {
		t.Run(filepath.Base(path), func(t *testing.T) {
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			rep := decodeCheck(t, egressd(t, "check", "--format", "json", "--config", path))
			explained := explainedWarnings(string(src))
			for _, p := range rep.Problems {
				if !p.Warning {
					t.Errorf("%s: error: %s: %s", path, *p.Path, p.Message)
					continue
				}
				// A checkout leaves configs/credentials.json 0644 (git keeps no modes; docs
				// blocks link to it):
				// that warning is the clone's, not the example's.
				if !explainedBy(p.Message, explained) && !strings.Contains(p.Message, "credentials.json is readable by every user") {
					t.Errorf("%s: warning no comment explains (add `# check warns: ...`): %s: %s", path, *p.Path, p.Message)
				}
			}
			if !*rep.OK {
				t.Errorf("%s: check is not ok", path)
			}
		})
	}
}

var checkWarnsComment = regexp.MustCompile(`#\s*check warns:\s*(.+)`)

func explainedWarnings(src string) []string {
	var out []string
	for _, m := range checkWarnsComment.FindAllStringSubmatch(src, -1) {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

func explainedBy(msg string, explained []string) bool {
	for _, e := range explained {
		if strings.Contains(msg, e) {
			return true
		}
	}
	return false
}

// docsExamples writes each ```yaml block of docs/*.md that starts with
// `version: 1` into a directory holding links to the files of configs/, as if saved
// there, and returns the paths.
func docsExamples(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	shipped, _ := filepath.Glob("../../configs/*.json")
	for _, f := range shipped {
		abs, _ := filepath.Abs(f)
		if err := os.Symlink(abs, filepath.Join(dir, filepath.Base(f))); err != nil {
			t.Fatal(err)
		}
	}
	pages, _ := filepath.Glob("../../docs/*.md")
	block := regexp.MustCompile("(?s)```yaml\n(version: 1\n.*?)```")
	var out []string
	for _, page := range pages {
		src, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range block.FindAllStringSubmatch(string(src), -1) {
			name := strings.TrimSuffix(filepath.Base(page), ".md") + "-" + string(rune('a'+i)) + ".yaml"
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, []byte(m[1]), 0o600); err != nil {
				t.Fatal(err)
			}
			out = append(out, p)
		}
	}
	return out
}

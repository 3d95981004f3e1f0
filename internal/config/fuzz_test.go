package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
)

// Fuzz targets for the two parsers: whatever the input, they return a
// result or an error that is (or wraps) a *ValidationError, and never
// panic. The seeds are the golden inputs, the shipped configs, and the
// corpus under testdata/fuzz/.

func FuzzParseConfig(f *testing.F) {
	addSeeds(f, "testdata/golden/*.yaml", "../../configs/*.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, "testdata/golden")
		checkFuzzResult(t, cfg != nil, err)
	})
}

func FuzzParsePolicy(f *testing.F) {
	addSeeds(f, "testdata/golden/*.json", "../../configs/environment.json")
	opts := allowlist.Options{DefaultPorts: []uint16{80, 443}, Intercept: allowlist.InterceptAuto}
	f.Fuzz(func(t *testing.T, data []byte) {
		pol, err := ParsePolicy(data, opts)
		checkFuzzResult(t, pol != nil, err)
	})
}

func checkFuzzResult(t *testing.T, ok bool, err error) {
	var ve *ValidationError
	switch {
	case err == nil && !ok:
		t.Fatal("no result and no error")
	case err != nil && ok:
		t.Fatalf("a result and an error: %v", err)
	case err != nil && !errors.As(err, &ve):
		t.Fatalf("error %T is not a *ValidationError: %v", err, err)
	case err != nil && len(ve.Problems) == 0:
		t.Fatal("a ValidationError without problems")
	}
}

func addSeeds(f *testing.F, globs ...string) {
	for _, g := range globs {
		files, _ := filepath.Glob(g)
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
}

package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplaces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	for _, data := range []string{"one", "two"} {
		if err := Write(path, []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
		assertFile(t, path, data, 0o640)
	}
	assertNoTemp(t, filepath.Dir(path))
}

func TestCreateIsExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := Create(path, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Create(path, []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create: %v, want fs.ErrExist", err)
	}
	assertFile(t, path, "first", 0o600)
	assertNoTemp(t, filepath.Dir(path))
}

func assertFile(t *testing.T, path, data string, perm fs.FileMode) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || string(got) != data {
		t.Fatalf("%s = %q, %v; want %q", path, got, err, data)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != perm {
		t.Errorf("%s mode %v, want %v", path, fi.Mode().Perm(), perm)
	}
}

func assertNoTemp(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("%d entries in %s, want only the file (no temp file left)", len(ents), dir)
	}
}

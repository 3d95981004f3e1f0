// Package atomicfile writes files so that a reader sees the old content or the
// whole new one, never a part: the data goes to a synced temp file in the same
// directory, which is then renamed or linked into place.
package atomicfile

import (
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, mode perm.
func Write(path string, data []byte, perm fs.FileMode) error {
	return place(path, data, perm, os.Rename)
}

// Create writes data to path, mode perm, and fails with fs.ErrExist when path
// exists: of two processes creating the same file, exactly one succeeds.
func Create(path string, data []byte, perm fs.FileMode) error {
	return place(path, data, perm, os.Link)
}

// place writes data to a synced temp file beside path and puts it there with
// move (rename or link). The temp file is removed in every case.
func place(path string, data []byte, perm fs.FileMode, move func(oldpath, newpath string) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp") // mode 0600
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return move(tmp, path)
}

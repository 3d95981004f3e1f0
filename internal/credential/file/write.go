package file

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/egressd/egressd/internal/atomicfile"
	"github.com/egressd/egressd/internal/credential"
)

var _ credential.Writer = (*Backend)(nil)

// errChanged: the entry is not the version the writer read (someone rotated it meanwhile).
var errChanged = errors.New("changed since it was read; not overwritten")

// Write replaces the secret of id with raw, when the file's entry is still version (a
// rotated oauth2 refresh token written back). Only that entry's bytes change: every other
// entry, the order and the layout stay as they were, and the file (a symlink's target)
// is replaced atomically with its mode kept. Errors name the file and the ID, never content.
func (b *Backend) Write(ctx context.Context, id, version string, raw map[string]any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	path, err := filepath.EvalSymlinks(b.path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	data, err := readFile(path)
	if err != nil {
		return err
	}
	entries, err := parse(b.path, data)
	if err != nil {
		return err
	}
	if e, ok := entries[id]; !ok || e.version != version {
		return fmt.Errorf("credentials file %s: credential %s %w", b.path, id, errChanged)
	}
	val, err := json.Marshal(raw)
	if err != nil {
		return fmt.Errorf("credentials file %s: credential %s: cannot encode the new secret", b.path, id)
	}
	out, err := splice(data, id, val)
	if err != nil {
		return fmt.Errorf("credentials file %s: %w", b.path, err)
	}
	return atomicfile.Write(path, out, fi.Mode().Perm())
}

// splice returns data with the value of top-level key id (its last occurrence, the one
// encoding/json reads) replaced by val.
func splice(data []byte, id string, val []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	start, end := -1, -1
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, errors.New("not valid JSON")
		}
		from := int(dec.InputOffset())
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errors.New("not valid JSON")
		}
		to := int(dec.InputOffset())
		if k, _ := t.(string); k == id {
			i := bytes.Index(data[from:to], v)
			if i < 0 {
				return nil, errors.New("cannot locate the entry")
			}
			start, end = from+i, from+i+len(v)
		}
	}
	if start < 0 {
		return nil, errors.New("no entry " + id)
	}
	return bytes.Join([][]byte{data[:start], val, data[end:]}, nil), nil
}

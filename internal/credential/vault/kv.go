package vault

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/egressd/egressd/internal/credential"
)

// kvPath is the KV v2 API path of id.
func (b *Backend) kvPath(id string) string {
	if b.kvPrefix == "" {
		return b.kvMount + "/data/" + id
	}
	return b.kvMount + "/data/" + b.kvPrefix + "/" + id
}

// readKV reads the current version of id from KV v2, through the Session's cache
// when the Backend shares one.
func (b *Backend) readKV(ctx context.Context, id string) (credential.Secret, string, error) {
	if b.shared != nil {
		return b.shared.readKV(ctx, b, id)
	}
	return b.readKVDirect(ctx, id)
}

// readKVDirect reads the current version of id from KV v2. A path without a secret, or
// whose current version is deleted or destroyed, is credential.ErrNotFound: Vault answered.
func (b *Backend) readKVDirect(ctx context.Context, id string) (credential.Secret, string, error) {
	path := b.kvPath(id)
	sec, err := b.client.Logical().ReadWithContext(ctx, path)
	if err != nil {
		return credential.Secret{}, "", describe("vault read", path, err)
	}
	if sec == nil || sec.Data == nil {
		return credential.Secret{}, "", fmt.Errorf("%w: no secret at %s", credential.ErrNotFound, path)
	}
	meta, _ := sec.Data["metadata"].(map[string]any)
	data, isMap := sec.Data["data"].(map[string]any)
	if sec.Data["data"] == nil {
		return credential.Secret{}, "", fmt.Errorf("%w: the current version at %s is %s", credential.ErrNotFound, path, deletedState(meta))
	}
	if !isMap {
		return credential.Secret{}, "", fmt.Errorf("credential %s: %s is not a KV v2 secret (is %s a KV v2 mount?): %w", id, path, b.kvMount, credential.ErrInvalid)
	}
	version, err := kvVersion(meta)
	if err != nil {
		return credential.Secret{}, "", fmt.Errorf("credential %s: %s: %w", id, path, err)
	}
	parsed, err := credential.Parse(id, data)
	if err != nil {
		return credential.Secret{}, "", err // names the ID and at most a key, never a value
	}
	return parsed, version, nil
}

// deletedState says why a KV version has no data.
func deletedState(meta map[string]any) string {
	if d, _ := meta["destroyed"].(bool); d {
		return "destroyed"
	}
	return "deleted"
}

// kvVersion returns metadata.version as a decimal string ("3").
func kvVersion(meta map[string]any) (string, error) {
	v, ok := meta["version"]
	if !ok {
		return "", fmt.Errorf("no metadata.version in the response")
	}
	n, ok := toInt(v)
	if !ok || n <= 0 {
		return "", fmt.Errorf("metadata.version is not a positive integer")
	}
	return strconv.FormatInt(n, 10), nil
}

// toInt reads a JSON number as the api package decodes it (json.Number), or as
// encoding/json does (float64), or a decimal string.
func toInt(v any) (int64, bool) {
	switch v := v.(type) {
	case json.Number:
		n, err := v.Int64()
		return n, err == nil
	case float64:
		return int64(v), v == float64(int64(v))
	case int:
		return int64(v), true
	case int64:
		return v, true
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

var _ credential.Writer = (*Backend)(nil)

// Write stores raw as a new KV v2 version of id's path, with check-and-set on version (the
// KV version the writer read), so that a version the security team wrote meanwhile is
// never overwritten. IDs read from other Vault paths cannot be written. The token needs
// "create" and "update" on the path.
func (b *Backend) Write(ctx context.Context, id, version string, raw map[string]any) error {
	if _, ok := b.paths[id]; ok {
		return fmt.Errorf("credential %s is read from a Vault path, not KV: it cannot be written back", id)
	}
	cas, err := strconv.Atoi(version)
	if err != nil {
		return fmt.Errorf("credential %s: version %q is not a KV version", id, version)
	}
	if _, err := b.sess.token(ctx); err != nil {
		return err
	}
	path := b.kvPath(id)
	_, err = b.client.Logical().WriteWithContext(ctx, path, map[string]any{"data": raw, "options": map[string]any{"cas": cas}})
	if err != nil {
		return describe("vault write", path, err)
	}
	if b.shared != nil {
		b.shared.forget(path) // the next read is of the version just written
	}
	return nil
}

package config

import (
	"reflect"
	"strings"
)

// Keys lists every key egressd.yaml may hold, as dotted paths read off the raw
// schema's yaml tags ("tls.deny_in_tunnel", "listeners[].address",
// "credentials.vault.paths.<id>.field"). The docs-completeness test checks that
// docs/configuration.md names each one, so a key added here is a key documented.
func Keys() []string {
	return walkKeys(reflect.TypeOf(rawConfig{}), "")
}

// EntryKeys lists the keys of one allowlist entry (policy.allowlist[] in YAML,
// network.allowlist[] in environment.json).
func EntryKeys() []string {
	return walkKeys(reflect.TypeOf(rawEntry{}), "")
}

// schemaChildren are the raw types that decode themselves: the segment their
// items take in a path and the type of each item.
var schemaChildren = map[reflect.Type]struct {
	segment string
	item    reflect.Type
}{
	reflect.TypeOf(rawAllowlist{}):  {"[]", reflect.TypeOf(rawEntry{})},
	reflect.TypeOf(rawVaultPaths{}): {".<id>", reflect.TypeOf(rawVaultPath{})},
}

func walkKeys(t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Struct {
			return nil // a list of values: the key itself is the leaf
		}
		if t.Kind() == reflect.Slice {
			prefix += "[]"
		}
		t = t.Elem()
	}
	if c, ok := schemaChildren[t]; ok {
		return walkKeys(c.item, prefix+c.segment)
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var keys []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		if sub := walkKeys(t.Field(i).Type, path); len(sub) > 0 {
			keys = append(keys, sub...)
			continue
		}
		keys = append(keys, path)
	}
	return keys
}

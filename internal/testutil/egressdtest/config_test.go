package egressdtest

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/config"
)

// TestConfigKeysKnown: Config names exactly the keys of internal/config's raw
// schema, so a suite can write every key and never one egressd does not know.
func TestConfigKeysKnown(t *testing.T) {
	got := keysOf(reflect.TypeOf(Config{}), "")
	want := config.Keys()
	slices.Sort(got)
	slices.Sort(want)
	for _, k := range got {
		if !slices.Contains(want, k) {
			t.Errorf("Config has %s, which egressd does not know", k)
		}
	}
	for _, k := range want {
		if !slices.Contains(got, k) {
			t.Errorf("Config lacks %s", k)
		}
	}
}

// keysOf lists the dotted yaml keys of t, as config.Keys writes them.
func keysOf(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		path := strings.TrimPrefix(prefix+"."+name, ".")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct:
			out = append(out, keysOf(ft, path)...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			out = append(out, keysOf(ft.Elem(), path+"[]")...)
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			out = append(out, keysOf(ft.Elem(), path+".<id>")...)
		default:
			out = append(out, path)
		}
	}
	return out
}

// TestConfigYAMLLoads: a Config as a suite writes it loads without problems.
func TestConfigYAMLLoads(t *testing.T) {
	c := &Config{
		Version: 1, Environment: "env_test",
		Listeners: []Listener{{Name: "sandbox", Address: "127.0.0.1:0", Mode: "proxy", Role: "sandbox"}},
		Admin:     &Admin{Address: "127.0.0.1:0"},
		Policy: Policy{Allowlist: []Entry{{Domain: "api.test", Ports: []int{443}, Credential: "api",
			Transform: map[string]string{"X-Injected": "v"}}}},
		Network:     Network{UnsafeAllowCIDRs: []string{"127.0.0.0/8"}},
		TLS:         &TLS{Intercept: "auto"},
		Credentials: &Credentials{Backend: "file", File: "credentials.json", MaxStale: "5m"},
		Limits:      &Limits{Dial: "7s", MaxConnections: 100},
		Log:         &Log{Level: "debug", Format: "json"},
	}
	b, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.Parse(b, t.TempDir()); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
}

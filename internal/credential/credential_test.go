package credential

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func secretValue() Value {
	return Value{
		ID:      "cred-1",
		Version: "v7",
		Headers: []Header{{Name: "Authorization", Value: "Bearer " + planted}, {Name: "X-Api-Key", Value: planted}},
		ReadAt:  time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

func TestValueRedactsInFmt(t *testing.T) {
	v := secretValue()
	type exported struct{ V Value }
	args := map[string]any{
		"value": v, "pointer": &v, "headers": v.Headers, "header": v.Headers[0],
		"nested": exported{v}, "nested pointer": &exported{v},
	}
	for name, arg := range args {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3v"} {
			out := fmt.Sprintf(verb, arg)
			if strings.Contains(out, planted) || strings.Contains(strings.ToLower(out), strings.ToLower(fmt.Sprintf("%x", planted))) {
				t.Errorf("%s with %s shows the secret: %s", name, verb, out)
			}
			if (verb == "%v" || verb == "%+v" || verb == "%#v") && !strings.Contains(out, "Authorization") {
				t.Errorf("%s with %s lost the header name: %s", name, verb, out)
			}
		}
	}
	if got, want := v.String(), "credential cred-1 version v7 headers [Authorization X-Api-Key]"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := fmt.Sprintf("%#v", v); !strings.HasPrefix(got, `credential.Value{ID:"cred-1", Version:"v7", Headers:[]string{"Authorization", "X-Api-Key"}`) {
		t.Errorf("%%#v = %s", got)
	}
}

func TestValueRedactsInJSON(t *testing.T) {
	v := secretValue()
	for name, arg := range map[string]any{"value": v, "pointer": &v, "headers": v.Headers, "nested": struct{ V Value }{v}} {
		out, err := json.Marshal(arg)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), planted) {
			t.Errorf("%s: JSON shows the secret: %s", name, out)
		}
	}
	out, _ := json.Marshal(v)
	want := `{"id":"cred-1","version":"v7","headers":["Authorization","X-Api-Key"],"read_at":"2026-01-02T03:04:05Z"}`
	if string(out) != want {
		t.Errorf("JSON %s, want %s", out, want)
	}
}

func TestValueRedactsInZerolog(t *testing.T) {
	v := secretValue()
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	log.Info().Object("v", v).Msg("object")
	log.Info().EmbedObject(v).Msg("embed")
	log.Info().Interface("v", v).Msg("interface")
	log.Info().Any("v", &v).Msg("any")
	log.Info().Stringer("v", v).Msg("stringer")
	log.Info().Array("h", zerolog.Arr().Object(v.Headers[0])).Msg("header")
	log.Info().Msgf("%v %+v", v, v.Headers)
	out := buf.String()
	if strings.Contains(out, planted) {
		t.Fatalf("zerolog output shows the secret:\n%s", out)
	}
	if n := strings.Count(out, "X-Api-Key"); n < 6 {
		t.Errorf("header names missing (%d):\n%s", n, out)
	}
	if !strings.Contains(out, `"v":{"id":"cred-1","version":"v7","headers":["Authorization","X-Api-Key"]`) {
		t.Errorf("Object rendering:\n%s", out)
	}
}

func TestUnavailableError(t *testing.T) {
	down := fmt.Errorf("vault: 503")
	err := error(&UnavailableError{ID: "cred-1", Cause: CauseStale, Err: down})
	if got, want := err.Error(), "credential cred-1 unavailable (stale): vault: 503"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	wrapped := fmt.Errorf("inject: %w", err)
	if !errors.Is(wrapped, ErrUnavailable) || !errors.Is(wrapped, down) {
		t.Error("errors.Is misses ErrUnavailable or the cause")
	}
	if got := (&UnavailableError{ID: "x", Cause: CauseNeverRead}).Error(); got != "credential x unavailable (never_read)" {
		t.Errorf("without Err: %q", got)
	}
}

package hooks

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestCheckDecision(t *testing.T) {
	const limit = 1 << 20
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string // the error's text; "" means the answer passes
	}{
		{"allow", 200, `{"decision": "allow"}`, ""},
		{"deny with reason", 200, `{"decision":"deny","reason":"rm -rf blocked"}`, ""},
		{"allow with extra fields and whitespace", 204, " {\"decision\":\"allow\",\"note\":{\"a\":[1]}}\n", ""},
		{"500", 500, `{"decision": "allow"}`, "endpoint returned 500"},
		{"403", 403, `{"decision": "deny"}`, "endpoint returned 403"},
		{"redirect", 302, ``, "endpoint returned 302"},
		{"garbage", 200, `<html>oops</html>`, "response is not JSON"},
		{"truncated", 200, `{"decision": "allow"`, "response is not JSON"},
		{"trailing data", 200, `{"decision": "allow"} {"decision": "deny"}`, "response is not JSON"},
		{"maybe", 200, `{"decision": "maybe"}`, `unknown decision "maybe"`},
		{"case differs", 200, `{"decision": "Allow"}`, `unknown decision "Allow"`},
		{"empty body", 200, ``, "empty response"},
		{"blank body", 200, " \n", "empty response"},
		{"decision is a number", 200, `{"decision": 1}`, `"decision" is not a string`},
		{"decision is null", 200, `{"decision": null}`, `"decision" is not a string`},
		{"decision is true", 200, `{"decision": true}`, `"decision" is not a string`},
		{"no decision", 200, `{"result": "allow"}`, `response has no "decision"`},
		{"array", 200, `[{"decision": "allow"}]`, "response is not a JSON object"},
		{"string", 200, `"allow"`, "response is not a JSON object"},
		{"decision twice", 200, `{"decision": "deny", "decision": "allow"}`, `response has "decision" twice`},
		{"decision twice, escaped", 200, `{"decision": "deny", "decisio\u006e": "allow"}`, `response has "decision" twice`},
		{"decision twice, case differs", 200, `{"decision": "deny", "Decision": "allow"}`, `response has "decision" twice`},
		{"decision twice, case differs first", 200, `{"DECISION": "allow", "decision": "deny"}`, `response has "decision" twice`},
		{"decision in other case only", 200, `{"Decision": "allow"}`, `response has no "decision"`},
		{"nested decision only", 200, `{"result": {"decision": "allow"}}`, `response has no "decision"`},
		{"oversized", 200, `{"decision": "allow", "pad": "` + strings.Repeat("x", limit) + `"}`, "response larger than 1048576 bytes"},
	} {
		err := CheckDecision(tc.status, []byte(tc.body), limit)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want it to pass", tc.name, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestVerdict(t *testing.T) {
	if d, err := Verdict(200, []byte(`{"decision":"deny"}`), 100); d != DecisionDeny || err != nil {
		t.Errorf("got %q %v", d, err)
	}
	if d, err := Verdict(200, []byte(`{"decision":"allow"}`), 100); d != DecisionAllow || err != nil {
		t.Errorf("got %q %v", d, err)
	}
	if d, _ := Verdict(500, []byte(`{"decision":"allow"}`), 100); d != "" {
		t.Errorf("a failed call has decision %q", d)
	}
}

func TestDenyBody(t *testing.T) {
	body := DenyBody(`endpoint returned 500`)
	if string(body) != `{"decision":"deny","reason":"egressd: endpoint returned 500 (fail-closed)"}` {
		t.Errorf("%s", body)
	}
	// What egressd answers is itself a well-formed deny, whatever the reason holds.
	body = DenyBody(`unknown decision "<\u2028>"`)
	var v map[string]string
	if err := json.Unmarshal(body, &v); err != nil || v["decision"] != "deny" || CheckDecision(200, body, 1<<20) != nil {
		t.Errorf("%s: %v", body, err)
	}
}

func TestDeadline(t *testing.T) {
	for timeout, want := range map[time.Duration]time.Duration{
		30 * time.Second:       29500 * time.Millisecond,
		10 * time.Second:       9500 * time.Millisecond,
		time.Second:            500 * time.Millisecond,
		600 * time.Millisecond: 100 * time.Millisecond,
		400 * time.Millisecond: 100 * time.Millisecond,
		0:                      100 * time.Millisecond,
	} {
		if got := Deadline(timeout); got != want {
			t.Errorf("Deadline(%s) = %s, want %s", timeout, got, want)
		}
	}
}

// FuzzCheckDecision: whatever passes must read as the same allow or deny to a plain
// encoding/json reader (the runtime's view), and egressd's own deny always passes.
func FuzzCheckDecision(f *testing.F) {
	for _, s := range []string{`{"decision":"allow"}`, `{"decision":"deny","reason":"x"}`, `{"decision":"maybe"}`,
		`[]`, ``, `{"decision":"deny","decision":"allow"}`, `{"decision":"\u0061llow"}`, `{"decision":"deny","Decision":"allow"}`} {
		f.Add(200, []byte(s))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		d, err := Verdict(status, body, 4096)
		if err != nil {
			return
		}
		var v struct{ Decision string }
		if json.Unmarshal(body, &v) != nil || v.Decision != d || (d != DecisionAllow && d != DecisionDeny) || status/100 != 2 {
			t.Fatalf("Verdict(%d, %q) = %q, but encoding/json reads %q", status, body, d, v.Decision)
		}
		if CheckDecision(200, DenyBody(string(body)), 1<<20) != nil {
			t.Fatalf("DenyBody(%q) is not a well-formed deny", body)
		}
	})
}

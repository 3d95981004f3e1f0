package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/credential"
)

// TestRunOAuth2FirstTokenWaits: the first request after a start to an oauth2 entry,
// whose token endpoint answers in 300 ms, waits for that first token call and is
// served with it, rather than refused no_access_token while the call is in flight.
func TestRunOAuth2FirstTokenWaits(t *testing.T) {
	t.Parallel()
	te := startTokenEndpoint(t, 60)
	te.delay.Store(int64(300 * time.Millisecond))
	up := startRecordingUpstream(t)
	_, e, target := startOAuthRunner(t, te, up, "")
	if r := fetchOnce(e.client(), target); !r.ok() {
		t.Fatalf("first request after the start: %+v, want it served once the token call answers", r)
	}
	if seen := up.requests(); len(seen) != 1 || !slices.Equal(seen[0].auth, []string{"Bearer at-PLANTED-1"}) {
		t.Fatalf("upstream saw %v, want exactly [Bearer at-PLANTED-1]", authOf(seen))
	}
}

// TestRunOAuth2FirstTokenBound: with a token endpoint that never answers, the first
// request waits credential.FirstReadWait, no longer, and gets 503
// credential_unavailable; nothing reaches the upstream.
func TestRunOAuth2FirstTokenBound(t *testing.T) {
	t.Parallel()
	te := startTokenEndpoint(t, 60)
	te.delay.Store(-1)
	up := startRecordingUpstream(t)
	_, e, target := startOAuthRunner(t, te, up, "")
	c := e.client()
	c.Timeout = credential.FirstReadWait + 10*time.Second
	r := fetchOnce(c, target)
	took := r.end.Sub(r.start)
	if r.status != http.StatusServiceUnavailable || r.reason != "credential_unavailable" {
		t.Fatalf("first request with the token endpoint silent: %+v, want 503 credential_unavailable", r)
	}
	if took < credential.FirstReadWait-time.Second || took > credential.FirstReadWait+3*time.Second {
		t.Errorf("the refusal came after %s, want about credential.FirstReadWait (%s)", took, credential.FirstReadWait)
	}
	if n := len(up.requests()); n != 0 {
		t.Errorf("%d requests reached the upstream without a token", n)
	}
}

// TestRunOAuth2FirstTokenPendingInReadyz: while an oauth2 credential's first token
// call is in flight (the token endpoint silent), /readyz says it is pending, not
// ready and with no error (a request would wait for it), rather than no_access_token.
func TestRunOAuth2FirstTokenPendingInReadyz(t *testing.T) {
	t.Parallel()
	te := startTokenEndpoint(t, 60)
	te.delay.Store(-1)
	d, _, _ := startOAuthRunner(t, te, startRecordingUpstream(t), "")
	code, body, err := d.AdminGet("/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var ready readyBody
	if err := json.Unmarshal(body, &ready); err != nil {
		t.Fatal(err)
	}
	if st := ready.Credentials["api"]; code != http.StatusOK || st.Ready || !st.Pending || st.Error != "" {
		t.Fatalf("/readyz %d, api %+v during the first token call; want 200 and api pending, not ready, no error", code, st)
	}
}

// readyBody is the part of /readyz these tests read.
type readyBody struct {
	Ready       bool                         `json:"ready"`
	Credentials map[string]credential.Status `json:"credentials"`
}

// TestRunReadyWithMissingCredential: a credential the file lacks keeps nothing from
// starting: /readyz is 200, says which credential is not ready and why, and
// egressd_credential_ready says 0 for it and 1 for the other; with
// readiness.require_credentials it is 503, as before.
func TestRunReadyWithMissingCredential(t *testing.T) {
	t.Parallel()
	const base = `version: 1
listeners: [{name: sandbox, address: "127.0.0.1:0"}]
admin: {address: "127.0.0.1:0"}
policy:
  allowlist:
    - {domain: a.example, credential: present}
    - {domain: b.example, credential: missing}
credentials: {file: credentials.json}
state_dir: state
`
	files := map[string]string{"credentials.json": `{"present": {"token": "tok-PLANTED-1"}}`}
	for _, strict := range []bool{false, true} {
		cfg := base
		if strict {
			cfg += "readiness: {require_credentials: true}\n"
		}
		d := startRunnerWith(t, cfg, files)
		wantCode := http.StatusOK
		if strict {
			wantCode = http.StatusServiceUnavailable
		}
		var ready readyBody
		deadline := time.Now().Add(waitTimeout)
		for {
			code, body, err := d.AdminGet("/readyz")
			if err != nil {
				t.Fatal(err)
			}
			json.Unmarshal(body, &ready)
			if !ready.Credentials["missing"].Pending || time.Now().After(deadline) {
				if code != wantCode || ready.Ready != !strict {
					t.Errorf("require_credentials %v: /readyz %d %+v, want %d", strict, code, ready, wantCode)
				}
				if m := regexp.MustCompile(`"age_seconds": (\d+\.\d{4,})`).FindSubmatch(body); m != nil {
					t.Errorf("age_seconds %s: want at most millisecond digits", m[1])
				}
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if p, m := ready.Credentials["present"], ready.Credentials["missing"]; !p.Ready || m.Ready || m.Error == "" {
			t.Errorf("credentials: present %+v, missing %+v; want present ready, missing not (with its cause)", p, m)
		}
		if v := d.metric(`egressd_credential_ready{credential="present"}`); v != 1 {
			t.Errorf(`egressd_credential_ready{credential="present"} = %v, want 1`, v)
		}
		if v := d.metric(`egressd_credential_ready{credential="missing"}`); v != 0 {
			t.Errorf(`egressd_credential_ready{credential="missing"} = %v, want 0`, v)
		}
		checkBuildAndCAMetrics(t, d)
	}
}

// checkBuildAndCAMetrics: egressd exports its CA's expiry (the generated CA is valid
// for two years) and build_info{version,commit,go} = 1.
func checkBuildAndCAMetrics(t *testing.T, d *runner) {
	t.Helper()
	m, err := d.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if exp := time.Unix(int64(m["egressd_ca_expiry_timestamp_seconds"]), 0); time.Until(exp) < 365*24*time.Hour {
		t.Errorf("egressd_ca_expiry_timestamp_seconds = %v, want the generated CA's expiry, two years ahead", exp)
	}
	want := fmt.Sprintf(`egressd_build_info{commit="unknown",go=%q,version="dev"}`, runtime.Version())
	if v, ok := m[want]; !ok || v != 1 {
		t.Errorf("%s = %v (%t), want 1", want, v, ok)
	}
}

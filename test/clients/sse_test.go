package clients_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/echo"
)

// sseEvents and sseGap shape the stream: an echo event, then sseEvents events
// sseGap apart, every odd one ending with the first bytes of the injected token.
const (
	sseEvents = 12
	sseGap    = 100 * time.Millisecond
)

var sseCases = []clientCase{
	{client: "python httpx SSE", name: "stream injected, timed", tool: "python", timed: true, run: sseStream},
}

// sseLine is one line of sse_client.py.
type sseLine struct {
	Status      int
	HTTPVersion string `json:"http_version"`
	Data        string
	At          int64
}

// sseStream reads a model-API-like SSE stream on the injected host as the openai
// SDK does: the first event is what the stand-in received (the injected
// credential, masked by the stand-in), and each later event is timed from the
// stand-in's flush to the client's read.
func sseStream(t *testing.T, w *world, path string) {
	label := func(i int) string { return strings.Replace(sseDelta(i), openaiSecret[:6], "<token start>", 1) }
	w.lat.measure(t, "sse", label, func(run int) []time.Duration {
		return sseRun(t, w, ssePath+strings.TrimPrefix(path, "/clients/")+itoa(run)+"/")
	})
}

// sseRun reads the stream at p and returns each event's latency.
func sseRun(t *testing.T, w *world, p string) []time.Duration {
	o := w.run(t, nil, python, script("sse_client.py"),
		"https://"+openaiHost+p+"?n="+itoa(sseEvents)+"&gap="+sseGap.String())
	ls := jsonLines[sseLine](o.stdout)
	if len(ls) != sseEvents+3 || ls[0].Status != 200 || ls[len(ls)-1].Data != "[DONE]" {
		t.Fatalf("the client printed %d lines, want the status, %d events and [DONE]\n%s", len(ls), sseEvents+1, o)
	}
	var first echo.Request
	if err := json.Unmarshal([]byte(ls[1].Data), &first); err != nil || first.Path != p || first.Header.Get("Authorization") != "Bearer <OPENAI>" {
		t.Errorf("the first event is %q, want the stand-in's echo with the injected Authorization", ls[1].Data)
	}
	if got, ok := w.up.saw(p); !ok || len(got.Header.Values("Authorization")) != 1 {
		t.Errorf("the stand-in saw %+v, want the request with exactly the injected Authorization", got)
	}
	flushed := w.up.sseFlushed(p)
	events := ls[2 : len(ls)-1]
	if len(flushed) != sseEvents {
		t.Fatalf("the stand-in flushed %d events, want %d", len(flushed), sseEvents)
	}
	var lat []time.Duration
	for i, e := range events {
		var ev struct {
			I     int
			Delta string
		}
		if err := json.Unmarshal([]byte(e.Data), &ev); err != nil || ev.I != i || ev.Delta != sseDelta(i) {
			t.Errorf("event %d is %q, want delta %q", i, e.Data, sseDelta(i))
		}
		lat = append(lat, time.Unix(0, e.At).Sub(flushed[i]))
	}
	return lat
}

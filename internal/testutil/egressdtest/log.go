package egressdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Line is one JSON line of egressd's log.
type Line map[string]any

// Str is field k as a string ("" when absent or not a string).
func (l Line) Str(k string) string { s, _ := l[k].(string); return s }

// Num is field k as a number (0 when absent or not a number).
func (l Line) Num(k string) float64 { f, _ := l[k].(float64); return f }

// Message is the line's message.
func (l Line) Message() string { return l.Str("message") }

// IsMessage matches the lines whose message is msg.
func IsMessage(msg string) func(Line) bool { return func(l Line) bool { return l.Message() == msg } }

// IsEgress matches the canonical log line of the request or tunnel reqID ("" for any).
func IsEgress(reqID string) func(Line) bool {
	return func(l Line) bool { return l.Message() == "egress" && (reqID == "" || l.Str("req_id") == reqID) }
}

// egressMarker finds a canonical line without decoding it.
var egressMarker = []byte(`"message":"egress"`)

// LogBytes is egressd's log so far.
func (e *Egressd) LogBytes() []byte {
	b, _ := os.ReadFile(e.LogPath)
	return b
}

// Lines is every JSON line logged so far (lines that are not JSON are skipped).
func (e *Egressd) Lines() ([]Line, error) { return e.Cursor(0).Next() }

// EgressLines is every canonical "egress" line logged so far.
func (e *Egressd) EgressLines() []Line {
	lines, _ := e.Lines()
	var out []Line
	for _, l := range lines {
		if l.Message() == "egress" {
			out = append(out, l)
		}
	}
	return out
}

// Cursor reads egressd's log from byte offset on (0: the start; LogSize: from
// now), each complete line once.
type Cursor struct {
	e       *Egressd
	off     int64
	pending []Line            // read, not yet returned: the lines after a Wait's match
	Skip    func([]byte) bool // lines it accepts are passed over undecoded
}

// Cursor starts a cursor at byte offset off of the log.
func (e *Egressd) Cursor(off int64) *Cursor { return &Cursor{e: e, off: off} }

// CursorAtEnd starts a cursor at the lines logged so far, skipping the canonical
// "egress" lines undecoded (under load there are thousands).
func (e *Egressd) CursorAtEnd() *Cursor {
	return &Cursor{e: e, off: e.LogSize(), Skip: func(b []byte) bool { return bytes.Contains(b, egressMarker) }}
}

// LogSize is the log's length in bytes so far.
func (e *Egressd) LogSize() int64 {
	fi, err := os.Stat(e.LogPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// Next returns the complete lines logged since the last call (or the last
// line a Wait returned).
func (c *Cursor) Next() ([]Line, error) {
	lines, err := c.read()
	lines, c.pending = append(c.pending, lines...), nil
	return lines, err
}

// read decodes the complete lines past off.
func (c *Cursor) read() ([]Line, error) {
	b, err := c.Raw()
	var out []Line
	for raw := range bytes.Lines(b) {
		var l Line
		if (c.Skip == nil || !c.Skip(raw)) && json.Unmarshal(raw, &l) == nil {
			out = append(out, l)
		}
	}
	return out, err
}

// Raw returns the complete lines past off, undecoded (not JSON ones too), and
// moves past them; it ignores Skip and the lines a Wait left pending.
func (c *Cursor) Raw() ([]byte, error) {
	f, err := os.Open(c.e.LogPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(c.off, io.SeekStart); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	end := bytes.LastIndexByte(b, '\n') + 1 // a partial last line waits for its end
	c.off += int64(end)
	return b[:end], nil
}

// Wait returns the next line that match accepts, waiting up to within.
func (c *Cursor) Wait(within time.Duration, match func(Line) bool) (Line, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return c.WaitContext(ctx, match)
}

// WaitContext is Wait bounded by ctx. It fails at once when egressd has exited
// and logged no such line.
func (c *Cursor) WaitContext(ctx context.Context, match func(Line) bool) (Line, error) {
	for {
		exited := !c.e.Alive() // read before the log: its last lines are then in
		lines, err := c.Next()
		if err != nil {
			return nil, err
		}
		for i, l := range lines {
			if match(l) {
				c.pending = lines[i+1:]
				return l, nil
			}
		}
		if exited {
			return nil, fmt.Errorf("egressd exited (%d) without logging it", c.e.exitCode())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.e.exited:
		case <-time.After(poll):
		}
	}
}

// WaitNth waits up to within for the nth line (from the start) that match accepts.
func (e *Egressd) WaitNth(within time.Duration, n int, match func(Line) bool) (Line, error) {
	seen := 0
	return e.Cursor(0).Wait(within, func(l Line) bool {
		if match(l) {
			seen++
		}
		return seen == n
	})
}

// Open is a finished run's files in dir, its log and stderr, for reading only
// (Lines, Cursor, Stderr, Summary); it has no process.
func Open(dir string) *Egressd {
	exited := make(chan struct{})
	close(exited)
	return &Egressd{Dir: dir, LogPath: filepath.Join(dir, LogName), StderrPath: filepath.Join(dir, StderrName), exited: exited}
}

package scrub

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestPacedReleasesOnPause: bytes held back because they could begin a secret are
// released once the source pauses, within the pause and not at its next write:
// as they are when shorter than MinLen, masked when longer; either way the rest of
// the occurrence, arriving later, is masked, and the secret never leaves whole.
func TestPacedReleasesOnPause(t *testing.T) {
	const secret = "tok-0123456789abcdef"
	set := Compile(secret)
	for _, cut := range []int{3, MinLen + 2} {
		pr, pw := io.Pipe()
		r := set.Reader(pr).Paced(20 * time.Millisecond)
		event := "data: " + secret[:cut]
		go io.WriteString(pw, event)
		start := time.Now()
		got := readWithin(t, r, len(event), 2*time.Second)
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Errorf("cut %d: the held bytes came after %v", cut, took)
		}
		want := event
		if cut >= MinLen {
			want = "data: " + strings.Repeat("*", cut)
		}
		if string(got) != want {
			t.Errorf("cut %d: released %q, want %q", cut, got, want)
		}
		go func() { io.WriteString(pw, secret[cut:]+"\n\n"); pw.Close() }()
		rest, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if want := strings.Repeat("*", len(secret)-cut) + "\n\n"; string(rest) != want {
			t.Errorf("cut %d: the rest came as %q, want %q", cut, rest, want)
		}
	}
}

// TestPacedWholeBody: a paced Reader masks a body written in one piece as the
// unpaced one does.
func TestPacedWholeBody(t *testing.T) {
	set := Compile("tok-0123456789abcdef")
	body := "a tok-0123456789abcdef b tok-0123"
	got, err := io.ReadAll(set.Reader(strings.NewReader(body)).Paced(20 * time.Millisecond))
	want, _ := io.ReadAll(set.Reader(strings.NewReader(body)))
	if err != nil || string(got) != string(want) {
		t.Errorf("paced %q %v, unpaced %q", got, err, want)
	}
}

// readWithin reads n bytes from r, failing the test if they take longer than d.
func readWithin(t *testing.T, r io.Reader, n int, d time.Duration) []byte {
	t.Helper()
	done := make(chan []byte, 1)
	go func() {
		got := make([]byte, 0, n)
		buf := make([]byte, 64)
		for len(got) < n {
			k, err := r.Read(buf)
			if err != nil {
				break
			}
			got = append(got, buf[:k]...)
		}
		done <- got
	}()
	select {
	case got := <-done:
		return got
	case <-time.After(d):
		t.Fatalf("%d bytes not released within %v", n, d)
		return nil
	}
}

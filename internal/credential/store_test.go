package credential

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/testutil/syncbuf"
)

// fakeBackend serves tokens from memory. Each setToken bumps the ID's version counter;
// fail and block script failures and slow reads.
type fakeBackend struct {
	mu       sync.Mutex
	tokens   map[string]string
	versions map[string]int
	errs     map[string]error
	reads    map[string][]time.Time
	block    chan struct{} // when set, Read waits for it to close (or ctx)
	entered  chan string   // told the ID of each read that starts waiting on block
}

func newFake() *fakeBackend {
	return &fakeBackend{tokens: map[string]string{}, versions: map[string]int{}, errs: map[string]error{},
		reads: map[string][]time.Time{}, entered: make(chan string, 100)}
}

func (f *fakeBackend) Name() string { return "fake" }

func (f *fakeBackend) Read(ctx context.Context, id string) (Secret, string, error) {
	f.mu.Lock()
	f.reads[id] = append(f.reads[id], time.Now())
	block := f.block
	f.mu.Unlock()
	if block != nil {
		f.entered <- id
		select {
		case <-block:
		case <-ctx.Done():
			return Secret{}, "", ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.errs[id]; err != nil {
		return Secret{}, "", err
	}
	tok, ok := f.tokens[id]
	if !ok {
		return Secret{}, "", fmt.Errorf("fake has no %s: %w", id, ErrNotFound)
	}
	return Secret{Headers: []Header{{Name: "Authorization", Value: "Bearer " + tok}}}, "v" + strconv.Itoa(f.versions[id]), nil
}

func (f *fakeBackend) setToken(id, tok string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens[id] = tok
	f.versions[id]++
}

func (f *fakeBackend) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.tokens, id)
}

func (f *fakeBackend) fail(id string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[id] = err
}

func (f *fakeBackend) setBlock(ch chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.block = ch
}

func (f *fakeBackend) readTimes(id string) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.reads[id]...)
}

// fakeClock is a manual clock for staleness.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// startStore starts a Store whose background refreshes never fire on their own unless o
// asks for them (Refresh defaults to MaxStale/3 of an hour), and stops it at cleanup.
func startStore(t *testing.T, b Backend, ids []string, o Options) *Store {
	t.Helper()
	if o.MaxStale == 0 {
		o.MaxStale = time.Hour
	}
	s := NewStore(b, ids, o)
	ctx, cancel := context.WithCancel(context.Background())
	s.Start(ctx)
	t.Cleanup(func() { cancel(); s.Wait() })
	return s
}

func unavailableCause(t *testing.T, err error) string {
	t.Helper()
	var ue *UnavailableError
	if !errors.As(err, &ue) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("want *UnavailableError, got %v", err)
	}
	return ue.Cause
}

var errBackendDown = errors.New("backend down")

func TestStoreServesFromMemory(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	s := startStore(t, f, []string{"a", "a", "", "ghost"}, Options{})

	v, err := s.Get("a")
	if err != nil || v.ID != "a" || v.Version != "v1" || len(v.Headers) != 1 || v.Headers[0].Value != "Bearer tok-a" {
		t.Fatalf("Get(a) = %v, %v", v, err)
	}
	if got := strings.Join(s.IDs(), ","); got != "a,ghost" {
		t.Errorf("IDs = %s", got)
	}
	if _, err := s.Get("ghost"); unavailableCause(t, err) != CauseNotFound || !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(ghost): %v", err)
	}
	if _, err := s.Get("not-managed"); unavailableCause(t, err) != CauseNeverRead {
		t.Errorf("Get(not-managed): %v", err)
	}
	st := s.Status()
	if !st["a"].Ready || st["a"].Version != "v1" || st["a"].Error != "" {
		t.Errorf("Status[a] = %+v", st["a"])
	}
	if st["ghost"].Ready || !strings.HasPrefix(st["ghost"].Error, "not_found: ") {
		t.Errorf("Status[ghost] = %+v", st["ghost"])
	}
	if s.Ready() {
		t.Error("Ready with ghost missing")
	}
	f.setToken("ghost", "tok-g")
	s.RefreshNow(context.Background(), "ghost")
	if !s.Ready() {
		t.Errorf("not Ready: %+v", s.Status())
	}
}

func TestStoreServesLastGoodUntilMaxStale(t *testing.T) {
	f, clock := newFake(), newClock()
	f.setToken("a", "tok-a")
	s := startStore(t, f, []string{"a"}, Options{MaxStale: 300 * time.Millisecond, Refresh: time.Hour, Now: clock.Now})

	f.fail("a", errBackendDown)
	s.RefreshNow(context.Background(), "a")
	clock.Advance(300 * time.Millisecond)
	if v, err := s.Get("a"); err != nil || v.Headers[0].Value != "Bearer tok-a" {
		t.Fatalf("at MaxStale: %v, %v", v, err)
	}
	if st := s.Status()["a"]; !st.Ready || st.AgeSeconds != 0.3 || st.Error != "refresh_failed: backend down" {
		t.Errorf("Status at MaxStale = %+v", st)
	}
	clock.Advance(time.Millisecond)
	_, err := s.Get("a")
	if unavailableCause(t, err) != CauseStale || !errors.Is(err, errBackendDown) {
		t.Errorf("past MaxStale: %v", err)
	}
	if st := s.Status()["a"]; st.Ready || st.Error != "stale: backend down" || st.Version != "v1" || s.Ready() {
		t.Errorf("Status past MaxStale = %+v", st)
	}

	f.fail("a", nil)
	s.RefreshNow(context.Background(), "a")
	if _, err := s.Get("a"); err != nil || !s.Ready() {
		t.Errorf("after recovery: %v", err)
	}
}

func TestStoreNotFoundAndInvalidAreUnavailableAtOnce(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	s := startStore(t, f, []string{"a"}, Options{Now: newClock().Now})

	f.remove("a")
	s.RefreshNow(context.Background(), "a")
	if _, err := s.Get("a"); unavailableCause(t, err) != CauseNotFound {
		t.Errorf("removed: %v", err)
	}
	f.setToken("a", "tok-a2")
	s.RefreshNow(context.Background(), "a")
	if v, err := s.Get("a"); err != nil || v.Version != "v2" {
		t.Errorf("restored: %v, %v", v, err)
	}

	_, invalid := ParseSecret("a", map[string]any{"tokn": "x"})
	f.fail("a", invalid)
	s.RefreshNow(context.Background(), "a")
	_, err := s.Get("a")
	if unavailableCause(t, err) != CauseInvalid || !errors.Is(err, ErrInvalid) {
		t.Errorf("invalid: %v", err)
	}
	if st := s.Status()["a"]; st.Ready || !strings.HasPrefix(st.Error, "invalid: credential a: unknown key") {
		t.Errorf("Status = %+v", st)
	}
}

func TestStoreNeverReadThenAvailable(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	f.fail("a", errBackendDown)
	s := startStore(t, f, []string{"a"}, Options{})
	_, err := s.Get("a")
	if unavailableCause(t, err) != CauseNeverRead || !errors.Is(err, errBackendDown) {
		t.Errorf("Get: %v", err)
	}
	if st := s.Status()["a"]; st.Ready || st.Error != "never_read: backend down" || st.AgeSeconds != 0 {
		t.Errorf("Status = %+v", st)
	}
	f.fail("a", nil)
	s.RefreshNow(context.Background(), "a")
	if _, err := s.Get("a"); err != nil {
		t.Errorf("after a good read: %v", err)
	}
}

// within fails the test if fn does not return within d: Get must never wait for a read.
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { fn(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s blocked on a backend read", what)
	}
}

func TestGetNeverBlocksOnASlowRead(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	s := startStore(t, f, []string{"a", "b"}, Options{})

	release := make(chan struct{})
	f.setBlock(release)
	refreshed := make(chan struct{})
	go func() { s.RefreshNow(context.Background(), ""); close(refreshed) }()
	<-f.entered
	<-f.entered // both reads are in progress
	f.setToken("a", "tok-a2")
	within(t, time.Second, "Get", func() {
		if v, err := s.Get("a"); err != nil || v.Version != "v1" {
			t.Errorf("during a read: %v, %v", v, err)
		}
		if _, err := s.Get("b"); unavailableCause(t, err) != CauseNotFound {
			t.Errorf("b during a read: %v", err)
		}
		_ = s.Status()
		_ = s.Ready()
	})
	close(release)
	<-refreshed
	if v, _ := s.Get("a"); v.Version != "v2" {
		t.Errorf("after the read: %v", v)
	}
}

func TestGetNeverBlocksDuringStart(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	release := make(chan struct{})
	f.setBlock(release)
	s := NewStore(f, []string{"a"}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	go func() { s.Start(ctx); close(started) }()
	<-f.entered
	within(t, time.Second, "Get", func() {
		if _, err := s.Get("a"); unavailableCause(t, err) != CauseNeverRead {
			t.Errorf("during Start: %v", err)
		}
	})
	f.setBlock(nil)
	close(release)
	<-started
	if _, err := s.Get("a"); err != nil {
		t.Errorf("after Start: %v", err)
	}
	cancel()
	s.Wait()
}

func TestStartIsBounded(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	f.setToken("b", "tok-b")
	f.setBlock(make(chan struct{})) // never released: reads end by timeout
	s := NewStore(f, []string{"a", "b"}, Options{ReadTimeout: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); s.Wait() }()
	begin := time.Now()
	s.Start(ctx)
	if d := time.Since(begin); d < 50*time.Millisecond || d > 2*time.Second {
		t.Errorf("Start took %v with ReadTimeout 50ms", d)
	}
	_, err := s.Get("a")
	if unavailableCause(t, err) != CauseNeverRead || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Get: %v", err)
	}
	if st := s.Status()["b"]; st.Error != "never_read: context deadline exceeded" {
		t.Errorf("Status = %+v", st)
	}
}

func TestReadCanceledByShutdownIsNotAFailure(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	s := NewStore(f, []string{"a"}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	s.Start(ctx)
	f.setBlock(make(chan struct{}))
	done := make(chan struct{})
	go func() { s.RefreshNow(ctx, "a"); close(done) }()
	<-f.entered
	cancel()
	<-done
	s.Wait()
	if st := s.Status()["a"]; !st.Ready || st.Error != "" {
		t.Errorf("Status after a canceled read = %+v", st)
	}
}

func TestJittered(t *testing.T) {
	base := 40 * time.Millisecond
	for _, c := range []struct {
		r    float64
		want time.Duration
	}{{0, 30 * time.Millisecond}, {0.5, base}, {0.75, 45 * time.Millisecond}} {
		if got := jittered(base, 0.25, c.r); got != c.want {
			t.Errorf("jittered(r=%v) = %v, want %v", c.r, got, c.want)
		}
	}
	if got := jittered(base, 0.25, 0.999999); got >= 50*time.Millisecond || got < 49*time.Millisecond {
		t.Errorf("jittered(r→1) = %v", got)
	}
	s := NewStore(newFake(), nil, Options{Refresh: base, Jitter: 0.25, MaxStale: time.Hour})
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := s.interval()
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 30*time.Millisecond || hi >= 50*time.Millisecond || hi-lo < 15*time.Millisecond {
		t.Errorf("1000 intervals span [%v, %v], want a spread inside [30ms, 50ms)", lo, hi)
	}
}

func TestBackgroundRefreshTiming(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	f.setToken("b", "tok-b")
	const refresh, jitter = 40 * time.Millisecond, 0.25
	s := startStore(t, f, []string{"a", "b"}, Options{Refresh: refresh, Jitter: jitter})
	time.Sleep(600 * time.Millisecond)
	lower := time.Duration(float64(refresh) * (1 - jitter))
	upper := time.Duration(float64(refresh)*(1+jitter)) + 60*time.Millisecond // scheduling slack under -race
	for _, id := range []string{"a", "b"} {
		reads := f.readTimes(id)
		if len(reads) < 6 || len(reads) > 21 {
			t.Errorf("%s: %d reads in 600ms, want about 600/40", id, len(reads))
		}
		// Every gap must respect the lower bound (a refresh never comes early); a
		// loaded machine may delay any one timer, so the upper bound holds for the
		// median gap rather than for each.
		var gaps []time.Duration
		for i := 1; i < len(reads); i++ {
			gap := reads[i].Sub(reads[i-1])
			if gap < lower {
				t.Errorf("%s: read %d came %v after the previous one, want at least %v", id, i, gap, lower)
			}
			gaps = append(gaps, gap)
		}
		if len(gaps) > 0 {
			slices.Sort(gaps)
			if med := gaps[len(gaps)/2]; med > upper {
				t.Errorf("%s: median gap between reads %v, want at most %v", id, med, upper)
			}
		}
	}
	if _, err := s.Get("a"); err != nil {
		t.Error(err)
	}
}

func TestOptionsDefaults(t *testing.T) {
	o := Options{}.withDefaults()
	if o.MaxStale != 5*time.Minute || o.Refresh != 30*time.Second || o.Jitter != 0.1 || o.ReadTimeout != 10*time.Second || o.Now == nil {
		t.Errorf("defaults: %+v", o)
	}
	if o := (Options{MaxStale: 300 * time.Millisecond}).withDefaults(); o.Refresh != 100*time.Millisecond {
		t.Errorf("Refresh not capped at MaxStale/3: %v", o.Refresh)
	}
	if o := (Options{Jitter: -1}).withDefaults(); o.Jitter != 0 {
		t.Errorf("negative Jitter: %v", o.Jitter)
	}
	if o := (Options{Jitter: 0.9}).withDefaults(); o.Jitter != 0.5 {
		t.Errorf("Jitter not capped: %v", o.Jitter)
	}
}

type metricsRecorder struct {
	mu      sync.Mutex
	results map[string]int // "id/result"
	ages    map[string][]float64
}

func (m *metricsRecorder) hooks() *Metrics {
	m.results, m.ages = map[string]int{}, map[string][]float64{}
	return &Metrics{
		Refresh: func(id, result string) { m.mu.Lock(); m.results[id+"/"+result]++; m.mu.Unlock() },
		Age:     func(id string, s float64) { m.mu.Lock(); m.ages[id] = append(m.ages[id], s); m.mu.Unlock() },
	}
}

func TestMetricsCallbacks(t *testing.T) {
	f, clock := newFake(), newClock()
	f.setToken("a", "tok-a")
	var rec metricsRecorder
	s := startStore(t, f, []string{"a", "b"}, Options{Metrics: rec.hooks(), Now: clock.Now})

	clock.Advance(2 * time.Second)
	f.fail("a", errBackendDown)
	s.RefreshNow(context.Background(), "a")
	f.fail("a", fmt.Errorf("credential a: bad: %w", ErrInvalid))
	s.RefreshNow(context.Background(), "a")
	f.fail("a", nil)
	s.RefreshNow(context.Background(), "")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := map[string]int{"a/ok": 2, "a/error": 1, "a/invalid": 1, "b/not_found": 2}
	if fmt.Sprint(rec.results) != fmt.Sprint(want) {
		t.Errorf("results %v, want %v", rec.results, want)
	}
	if got := fmt.Sprint(rec.ages["a"]); got != "[0 2 2 0]" || len(rec.ages["b"]) != 0 {
		t.Errorf("ages %v", rec.ages)
	}
}

func TestRotationAndFailureLogs(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-"+planted)
	var buf syncBuffer
	s := startStore(t, f, []string{"a"}, Options{Log: zerolog.New(&buf)})

	f.setToken("a", "tok2-"+planted)
	s.RefreshNow(context.Background(), "a")
	s.RefreshNow(context.Background(), "a") // same version: no line
	f.fail("a", errBackendDown)
	s.RefreshNow(context.Background(), "a")
	f.fail("a", nil)
	s.RefreshNow(context.Background(), "a")

	out := buf.String()
	if strings.Contains(out, planted) {
		t.Fatalf("log shows the secret:\n%s", out)
	}
	want := []string{
		`{"level":"info","credential":"a","version":"v1","backend":"fake","message":"credential loaded"}`,
		`{"level":"info","credential":"a","version":"v2","previous_version":"v1","backend":"fake","message":"credential rotated"}`,
		`{"level":"warn","credential":"a","backend":"fake","result":"error","error":"backend down","message":"credential read failed"}`,
		`{"level":"info","credential":"a","version":"v2","backend":"fake","previous_result":"error","message":"credential recovered"}`,
	}
	if got := strings.Split(strings.TrimSpace(out), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("log lines:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
}

func TestStartTwicePanics(t *testing.T) {
	s := startStore(t, newFake(), nil, Options{})
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	s.Start(context.Background())
}

func TestGetDoesNotAllocate(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	s := startStore(t, f, []string{"a"}, Options{})
	if n := testing.AllocsPerRun(1000, func() { _, _ = s.Get("a") }); n != 0 {
		t.Errorf("Get allocates %v times per call", n)
	}
}

func BenchmarkGet(b *testing.B) {
	f := newFake()
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = "cred-" + strconv.Itoa(i)
		f.setToken(ids[i], "tok")
	}
	s := NewStore(f, ids, Options{MaxStale: time.Hour})
	s.RefreshNow(context.Background(), "")
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Get("cred-7"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Get("cred-7"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

type syncBuffer = syncbuf.Buffer

// TestStatusAgeMilliseconds: /readyz's age_seconds is rounded to the millisecond and
// prints as such (12.014, not 12.014000000000001).
func TestStatusAgeMilliseconds(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok")
	clock := newClock()
	s := startStore(t, f, []string{"a"}, Options{Now: clock.Now})
	clock.Advance(12014*time.Millisecond + 400*time.Microsecond)
	st := s.Status()["a"]
	b, _ := json.Marshal(st)
	if st.AgeSeconds != 12.014 || !strings.Contains(string(b), `"age_seconds":12.014}`) {
		t.Errorf("age %v, JSON %s; want 12.014", st.AgeSeconds, b)
	}
}

// TestStartAsyncPending: with StartAsync the first read runs in the background: the
// ID is pending (not an error) until it is done, AwaitFirst waits for it, bounded by
// its context, and FirstRead closes once every first read is done.
func TestStartAsyncPending(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok")
	f.block = make(chan struct{})
	s := NewStore(f, []string{"a"}, Options{MaxStale: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); s.Wait() })
	s.StartAsync(ctx)
	<-f.entered
	if st := s.Status()["a"]; !st.Pending || st.Ready || st.Error != "" {
		t.Errorf("during the first read: %+v, want pending", st)
	}
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	s.AwaitFirst(short, "a")
	stop()
	if _, err := s.Get("a"); err == nil {
		t.Fatal("served before the first read ended")
	}
	done := make(chan struct{})
	go func() { s.AwaitFirst(ctx, "a"); close(done) }()
	close(f.block)
	<-done
	<-s.FirstRead()
	if v, err := s.Get("a"); err != nil || s.Status()["a"].Pending {
		t.Errorf("after the first read: %v %v %+v", v, err, s.Status()["a"])
	}
}

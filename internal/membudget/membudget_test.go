package membudget

import (
	"math"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func TestReserveRefusesWhatDoesNotFit(t *testing.T) {
	b := New(100)
	if !b.Reserve(Heads, 60) {
		t.Fatal("60 of 100 refused")
	}
	if b.Reserve(H2Windows, 41) {
		t.Fatal("41 more granted: 101 of 100")
	}
	if !b.Reserve(H2Windows, 40) {
		t.Fatal("40 more refused: 100 of 100")
	}
	if b.Reserve(Heads, 1) {
		t.Fatal("a byte past the limit granted")
	}
	if got := [2]int64{b.Held(Heads), b.Held(H2Windows)}; got != [2]int64{60, 40} {
		t.Errorf("held %v, want [60 40]", got)
	}
	b.Release(Heads, 60)
	if !b.Reserve(Heads, 60) {
		t.Error("60 refused after 60 were released")
	}
	if b.Used() != 100 {
		t.Errorf("used %d, want 100", b.Used())
	}
}

// TestCapBoundsOneHolder: a holder at its cap is refused while the budget has
// room, which the others still get.
func TestCapBoundsOneHolder(t *testing.T) {
	b := New(100)
	b.SetCap(Heads, 30)
	if !b.Reserve(Heads, 30) || b.Reserve(Heads, 1) {
		t.Fatal("the cap of 30 did not hold")
	}
	if !b.Reserve(H2Windows, 70) {
		t.Fatal("another holder was refused the room the capped one left")
	}
	if b.Held(Heads) != 30 || b.Used() != 100 {
		t.Errorf("held %d, used %d", b.Held(Heads), b.Used())
	}
	b.Release(H2Windows, 70)
	b.SetCap(Heads, 0)
	if !b.Reserve(Heads, 70) {
		t.Error("uncapped, the holder was refused what fits")
	}
}

// TestSetAsideIsAStandingShare: hook bodies' share counts against the others at
// once, replaces itself on a reload, and is kept even past a lowered limit, the
// others then refused until enough is released.
func TestSetAsideIsAStandingShare(t *testing.T) {
	b := New(100)
	b.SetAside(HookBodies, 50)
	if b.Reserve(Heads, 51) {
		t.Fatal("51 granted beside a share of 50 in 100")
	}
	b.Reserve(Heads, 50)
	b.SetAside(HookBodies, 30)
	if b.Used() != 80 || b.Held(HookBodies) != 30 {
		t.Fatalf("after the share shrank: used %d, share %d", b.Used(), b.Held(HookBodies))
	}
	b.SetLimit(60)
	b.SetAside(HookBodies, 30)
	if b.Used() != 80 {
		t.Fatalf("a share re-set under a lower limit: used %d, want 80", b.Used())
	}
	if b.Reserve(H2Windows, 1) {
		t.Fatal("granted a byte while the share is past the lowered limit")
	}
	b.Release(Heads, 50)
	if !b.Reserve(H2Windows, 30) {
		t.Fatal("refused what fits once the heads were released")
	}
}

// TestReserveNeverOvershoots: racing reservations never take more than the limit.
func TestReserveNeverOvershoots(t *testing.T) {
	const limit, each, workers = 1 << 20, 4096, 64
	b := New(limit)
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for range workers {
		wg.Go(func() {
			for range 100 {
				if b.Reserve(Heads, each) {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if granted != limit/each || b.Used() != limit {
		t.Errorf("granted %d reservations (%d bytes), want exactly %d", granted, b.Used(), limit/each)
	}
}

func TestNilBudgetGrantsEverything(t *testing.T) {
	var b *Budget
	if !b.Reserve(Heads, math.MaxInt64) || b.Held(Heads) != 0 || b.Limit() != 0 {
		t.Error("a nil budget refused or counted")
	}
	b.Release(Heads, 1)
	b.SetAside(HookBodies, 1)
}

func TestHolderNames(t *testing.T) {
	for _, h := range Holders() {
		if h.String() == "" || h.Detail() != "memory_"+h.String() {
			t.Errorf("holder %d: name %q, detail %q", h, h, h.Detail())
		}
	}
}

// fakeCgroup makes the cgroup's limit n (0: none) for one test.
func fakeCgroup(t *testing.T, n uint64) {
	old := cgroupLimit
	t.Cleanup(func() { cgroupLimit = old })
	cgroupLimit = func() (uint64, error) {
		if n == 0 {
			return 0, memlimit.ErrNoLimit
		}
		return n, nil
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name       string
		configured int64
		cgroup     uint64
		gomemlimit string
		want       int64
		from       string
	}{
		{"explicit", 192 << 20, 256 << 20, "", 192 << 20, FromConfig},
		{"auto: a quarter of the cgroup", 0, 256 << 20, "", 64 << 20, FromCgroup},
		{"auto: the cgroup before GOMEMLIMIT", 0, 1 << 30, "100MiB", 256 << 20, FromCgroup},
		{"auto: a quarter of GOMEMLIMIT", 0, 0, "200MiB", 50 << 20, FromGOMEMLIMIT},
		{"auto: at least MinAuto", 0, 16 << 20, "", MinAuto, FromCgroup},
		{"auto: nothing visible", 0, 0, "", DefaultBytes, FromDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakeCgroup(t, tc.cgroup)
			t.Setenv("GOMEMLIMIT", tc.gomemlimit)
			if tc.gomemlimit != "" {
				setMemoryLimit(t, 200<<20)
			}
			if got, from := Resolve(tc.configured); got != tc.want || from != tc.from {
				t.Errorf("Resolve(%d) = %d MiB from %q, want %d MiB from %q", tc.configured, got>>20, from, tc.want>>20, tc.from)
			}
		})
	}
}

// setMemoryLimit stands in for the runtime reading GOMEMLIMIT at start.
func setMemoryLimit(t *testing.T, n int64) {
	old := debug.SetMemoryLimit(n)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
}

func TestSetGoMemLimitFromCgroup(t *testing.T) {
	var limit uint64 = 256 << 20
	fakeCgroup(t, limit)
	t.Setenv("GOMEMLIMIT", "")
	t.Setenv("AUTOMEMLIMIT", "")
	os.Unsetenv("AUTOMEMLIMIT") // set or empty, it would override the ratio
	setMemoryLimit(t, math.MaxInt64)
	n, from := SetGoMemLimit()
	if want := int64(float64(limit) * goMemLimitRatio); n != want || from != FromCgroup {
		t.Errorf("SetGoMemLimit = %d from %q, want %d from the cgroup", n, from, want)
	}
	if got := debug.SetMemoryLimit(-1); got != n {
		t.Errorf("the runtime's limit is %d, want %d", got, n)
	}
}

func TestSetGoMemLimitKeepsTheEnvironments(t *testing.T) {
	fakeCgroup(t, 256<<20)
	t.Setenv("GOMEMLIMIT", "100MiB")
	setMemoryLimit(t, 100<<20)
	if n, from := SetGoMemLimit(); n != 100<<20 || from != FromGOMEMLIMIT {
		t.Errorf("SetGoMemLimit = %d from %q, want GOMEMLIMIT's 100 MiB", n, from)
	}
}

func TestSetGoMemLimitWithoutALimit(t *testing.T) {
	fakeCgroup(t, 0)
	t.Setenv("GOMEMLIMIT", "")
	setMemoryLimit(t, math.MaxInt64)
	if n, from := SetGoMemLimit(); n != 0 || from != "" {
		t.Errorf("SetGoMemLimit with no cgroup limit = %d from %q, want none", n, from)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("the runtime's limit became %d", got)
	}
}

func TestShortfalls(t *testing.T) {
	defaults := Demand{Budget: 64 << 20, Listeners: 1, HookBuffer: 32 << 20, HookBodyMax: 1 << 20}
	for _, tc := range []struct {
		name  string
		d     Demand
		limit int64
		keys  []string
	}{
		{"defaults at the shipped 256 MiB", defaults, 256 << 20, nil},
		{"a budget past the limit", Demand{Budget: 300 << 20, Listeners: 1, HookBuffer: 32 << 20, HookBodyMax: 1 << 20},
			256 << 20, []string{"limits.memory"}},
		{"two listeners at the shipped 256 MiB", Demand{Budget: 64 << 20, Listeners: 2, HookBuffer: 32 << 20, HookBodyMax: 1 << 20},
			256 << 20, nil},
		{"listeners whose overflow does not fit", Demand{Budget: 64 << 20, Listeners: 6, HookBuffer: 32 << 20, HookBodyMax: 1 << 20},
			256 << 20, []string{"limits.memory"}},
		{"a hook buffer past half the budget", Demand{Budget: 16 << 20, Listeners: 1, HookBuffer: 32 << 20, HookBodyMax: 1 << 20},
			256 << 20, []string{"limits.hook_buffer_bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var keys []string
			for _, s := range tc.d.Shortfalls(tc.limit, FromCgroup) {
				keys = append(keys, s.Key)
				t.Log(s.Key + ": " + s.Msg)
			}
			if !slices.Equal(keys, tc.keys) {
				t.Errorf("shortfalls %v, want %v", keys, tc.keys)
			}
		})
	}
}

// TestShareReservesFromItsParent: a share's reservations count in its parent,
// and are refused when either is spent; which one refused is counted apart, and a
// refusal by the parent leaves nothing held in the share.
func TestShareReservesFromItsParent(t *testing.T) {
	node := New(100)
	a, b := node.Share(60), node.Share(60)
	if !a.Reserve(Conns, 60) || a.Reserve(Conns, 1) {
		t.Fatal("share a: 60 of 60 refused, or a byte past it granted")
	}
	if a.Refused() != 1 || node.Refused() != 0 {
		t.Errorf("refused: share %d, node %d; want 1, 0", a.Refused(), node.Refused())
	}
	if !b.Reserve(Conns, 40) {
		t.Fatal("share b refused the 40 the node has left")
	}
	if b.Reserve(Heads, 1) || b.Held(Heads) != 0 || b.Used() != 40 {
		t.Fatalf("a byte past the node's limit granted, or left held in the share (used %d)", b.Used())
	}
	if node.Refused() != 1 || b.Refused() != 0 {
		t.Errorf("refused: node %d, share b %d; want 1, 0", node.Refused(), b.Refused())
	}
	if node.Used() != 100 || node.Held(Conns) != 100 || b.Room() != 0 {
		t.Errorf("node used %d, conns %d, b's room %d; want 100, 100, 0", node.Used(), node.Held(Conns), b.Room())
	}
	a.Release(Conns, 60)
	if node.Used() != 40 || a.Used() != 0 || !b.Reserve(Conns, 20) {
		t.Errorf("after a's release: node used %d, a used %d, or b refused what fits", node.Used(), a.Used())
	}
	b.Take(Conns, 100)
	if node.Used() != 160 || b.Used() != 160 {
		t.Errorf("Take: node used %d, b used %d; want 160 both", node.Used(), b.Used())
	}
}

// TestShareKeepsItsOwnAside: a share's standing share counts against its own
// reservations only, not against the parent's or the other shares'.
func TestShareKeepsItsOwnAside(t *testing.T) {
	node := New(100)
	a, b := node.Share(50), node.Share(100)
	a.SetAside(HookBodies, 40)
	if a.Reserve(Conns, 11) || !a.Reserve(Conns, 10) {
		t.Fatal("share a's standing share of 40 did not bound its other holders to 10")
	}
	if node.Used() != 10 || !b.Reserve(Conns, 90) {
		t.Errorf("the node counts a's standing share (used %d)", node.Used())
	}
}

// TestTryReserveNamesWhichWasSpent: the share's own refusal names the holder, the
// node's is prefixed node_.
func TestTryReserveNamesWhichWasSpent(t *testing.T) {
	node := New(100)
	a := node.Share(50)
	if d := a.TryReserve(Conns, 51); d != "memory_conns" {
		t.Errorf("the share spent: %q, want memory_conns", d)
	}
	node.Take(Heads, 80)
	if d := a.TryReserve(Conns, 30); d != "node_memory_conns" {
		t.Errorf("the node spent: %q, want node_memory_conns", d)
	}
	if d := a.TryReserve(Conns, 20); d != "" {
		t.Errorf("what fits both refused: %q", d)
	}
}

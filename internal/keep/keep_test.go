package keep

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"
)

// A worker that dies leaves its sockets and data with the parent: the port stays
// bound (no one else can take it, connections wait in the backlog), and the next
// worker serves the same socket and reads the same data.
func TestWorkerDeathKeepsSockets(t *testing.T) {
	s := NewStore()
	defer s.Close()
	k1 := worker(t, s)
	ln1, err := Listen(k1, "sock/a", func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") })
	if err != nil {
		t.Fatal(err)
	}
	addr := ln1.Addr().String()
	if err := k1.Put("spec/a", []byte(`{"netns": "/run/netns/a"}`)); err != nil {
		t.Fatal(err)
	}
	waitKept(t, s, 2)
	die(k1, ln1)

	if ln, err := net.Listen("tcp", addr); !errors.Is(err, syscall.EADDRINUSE) {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("binding %s with the worker dead: %v, want EADDRINUSE", addr, err)
	}
	waiting, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("a connection while no worker serves: %v, want it to wait in the backlog", err)
	}
	defer waiting.Close()

	k2 := worker(t, s)
	if err := k2.Take(); err != nil {
		t.Fatal(err)
	}
	ln2, err := Listen(k2, "sock/a", func() (net.Listener, error) { return nil, errors.New("opened anew, not taken") })
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if ln2.Addr().String() != addr {
		t.Errorf("taken listener on %s, want %s", ln2.Addr(), addr)
	}
	ln2.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	if c, err := ln2.Accept(); err != nil {
		t.Errorf("the connection that waited: %v", err)
	} else {
		c.Close()
	}
	if data, err := k2.Data("spec/a"); err != nil || !bytes.Equal(data, []byte(`{"netns": "/run/netns/a"}`)) {
		t.Errorf("data: %q %v", data, err)
	}
	if gone := k2.Prune(); len(gone) != 0 {
		t.Errorf("pruned %v, want nothing: both were claimed", gone)
	}
}

// What the next worker does not claim is let go, and a released socket closes:
// its port is free again at once.
func TestPruneAndRelease(t *testing.T) {
	s := NewStore()
	defer s.Close()
	k1 := worker(t, s)
	var addrs []string
	for _, key := range []string{"sock/a", "sock/b"} {
		ln, err := Listen(k1, key, func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") })
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, ln.Addr().String())
		ln.Close()
	}
	waitKept(t, s, 2)
	die(k1)

	k2 := worker(t, s)
	if err := k2.Take(); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(k2, "sock/a", func() (net.Listener, error) { return nil, errors.New("opened anew") })
	if err != nil {
		t.Fatal(err)
	}
	if gone := k2.Prune(); !slices.Equal(gone, []string{"sock/b"}) {
		t.Errorf("pruned %v, want [sock/b]", gone)
	}
	mustBind(t, addrs[1])
	k2.Release("sock/a")
	ln.Close()
	mustBind(t, addrs[0])
	if n := s.Len(); n != 0 {
		t.Errorf("the parent keeps %d descriptors, want 0", n)
	}
}

// A key taken twice (a sandbox's new spec serving the same address before the
// old one closes) is let go only when both are done with it.
func TestReleaseCounts(t *testing.T) {
	s := NewStore()
	defer s.Close()
	k := worker(t, s)
	open := func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
	a, err := Listen(k, "sock/a", open)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Listen(k, "sock/a", func() (net.Listener, error) { return nil, errors.New("opened anew") })
	if err != nil {
		t.Fatal(err)
	}
	if a.Addr().String() != b.Addr().String() {
		t.Fatalf("%s and %s: want one socket", a.Addr(), b.Addr())
	}
	k.Release("sock/a")
	a.Close()
	if _, err := net.Listen("tcp", a.Addr().String()); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("after the first release: %v, want the socket still bound", err)
	}
	k.Release("sock/a")
	b.Close()
	mustBind(t, a.Addr().String())
}

// Without a parent (--no-supervise), a nil Keeper only opens.
func TestNilKeeper(t *testing.T) {
	var k *Keeper
	ln, err := Listen(k, "sock/a", func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") })
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	k.Release("sock/a")
	if err := k.Take(); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Data("spec/a"); err == nil {
		t.Fatal("a nil Keeper has data")
	}
}

func worker(t *testing.T, s *Store) *Keeper {
	t.Helper()
	f, err := s.Attach()
	if err != nil {
		t.Fatal(err)
	}
	k, err := attach(f)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// die closes everything a worker holds, as its exit does.
func die(k *Keeper, lns ...net.Listener) {
	for _, ln := range lns {
		ln.Close()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range k.kept {
		closeFD(e.fd)
	}
	k.l.Close()
}

// waitKept waits until the parent has n descriptors: a worker's holds are not
// answered.
func waitKept(t *testing.T, s *Store, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); s.Len() != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the parent keeps %d, want %d", s.Len(), n)
		}
	}
}

func mustBind(t *testing.T, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("binding %s: %v, want it free", addr, err)
	}
	ln.Close()
}

// A worker that finds its address in use asks the parent for the key: another
// worker (the one an upgrade replaces) may have left that socket after this one
// started.
func TestFetchAfterStart(t *testing.T) {
	s := NewStore()
	defer s.Close()
	k2 := worker(t, s)
	if err := k2.Take(); err != nil {
		t.Fatal(err)
	}
	k1 := worker(t, s)
	ln1, err := Listen(k1, "sock/x", func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") })
	if err != nil {
		t.Fatal(err)
	}
	defer ln1.Close()
	waitKept(t, s, 1)
	addr := ln1.Addr().String()
	ln2, err := Listen(k2, "sock/x", func() (net.Listener, error) { return net.Listen("tcp", addr) })
	if err != nil {
		t.Fatalf("the address the other worker left: %v, want its socket", err)
	}
	defer ln2.Close()
	if ln2.Addr().String() != addr {
		t.Errorf("%s, want %s", ln2.Addr(), addr)
	}
	if _, err := Listen(k2, "sock/y", func() (net.Listener, error) { return net.Listen("tcp", addr) }); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("another key on the same address: %v, want EADDRINUSE", err)
	}
}

// Before Prune, a socket taken from the parent that a failed start claimed and
// released waits unclaimed for what comes next (a last good spec); Prune then
// lets it go.
func TestReleaseBeforePrune(t *testing.T) {
	s := NewStore()
	defer s.Close()
	k1 := worker(t, s)
	ln, err := Listen(k1, "sock/a", func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") })
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	waitKept(t, s, 1)
	die(k1, ln)
	k2 := worker(t, s)
	if err := k2.Take(); err != nil {
		t.Fatal(err)
	}
	taken := func() net.Listener {
		ln, err := Listen(k2, "sock/a", func() (net.Listener, error) { return nil, errors.New("opened anew, not taken") })
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	failed := taken() // a start that fails lets go of what it took
	failed.Close()
	k2.Release("sock/a")
	if _, err := net.Listen("tcp", addr); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("after a failed start released it: %v, want the socket still held", err)
	}
	restored := taken()
	restored.Close()
	k2.Release("sock/a")
	if gone := k2.Prune(); len(gone) != 1 {
		t.Errorf("pruned %v, want the released socket", gone)
	}
	mustBind(t, addr)
}

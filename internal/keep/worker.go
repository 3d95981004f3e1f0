package keep

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// replyTimeout bounds a wait for the parent: it answers at once, unless it is
// gone, and then the worker is stopping too (its parent-death signal).
const replyTimeout = 30 * time.Second

// Keeper is a worker's side. A nil *Keeper (no supervising parent: egressd run
// --no-supervise) keeps nothing: Listen and ListenPacket only open.
type Keeper struct {
	mu     sync.Mutex
	l      *link
	kept   map[string]*entry
	pruned bool // Prune ran: what is taken from the parent and unclaimed is let go
}

// entry is one descriptor the parent keeps, with this worker's own copy.
type entry struct {
	fd    int
	refs  int  // how many users have it; 0: taken from the parent, not claimed yet
	taken bool // taken from the parent (Take)
}

// Worker returns this process's Keeper when its supervising parent passed one
// (EnvFD), and unsets the variable; nil, nil when it did not.
func Worker() (*Keeper, error) {
	v, ok := os.LookupEnv(EnvFD)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(EnvFD)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: not a descriptor", EnvFD, v)
	}
	unix.CloseOnExec(fd)
	return attach(os.NewFile(uintptr(fd), "keep"))
}

// attach makes a Keeper of a worker's end of the pair.
func attach(f *os.File) (*Keeper, error) {
	l, err := open(f)
	if err != nil {
		return nil, err
	}
	return &Keeper{l: l, kept: map[string]*entry{}}, nil
}

// Take receives what earlier workers left with the parent. Each is held here,
// unclaimed, until Listen, ListenPacket or Data claims it, or Prune lets it go.
func (k *Keeper) Take() error {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.receive(opRequest, "")
}

// receive asks the parent for what it keeps (op opRequest) or for key's
// descriptor (opGet), and holds what it sends, unclaimed.
func (k *Keeper) receive(op byte, key string) error {
	k.l.c.SetDeadline(time.Now().Add(replyTimeout))
	defer k.l.c.SetDeadline(time.Time{})
	if err := k.l.send(op, key, -1); err != nil {
		return fmt.Errorf("keep: asking the parent: %w", err)
	}
	for {
		op, key, fd, err := k.l.recv()
		switch {
		case err != nil:
			return fmt.Errorf("keep: taking from the parent: %w", err)
		case op == opEnd:
			return nil
		case op == opHold && fd >= 0:
			k.replace(key, &entry{fd: fd, taken: true})
		default:
			closeFD(fd)
		}
	}
}

// replace puts e under key, closing this worker's copy of what was there.
func (k *Keeper) replace(key string, e *entry) {
	if old := k.kept[key]; old != nil {
		closeFD(old.fd)
	}
	k.kept[key] = e
}

// Listen returns a listener on the socket kept under key, or opens one with open
// and leaves a copy with the parent. Each Listen is paired with a Release.
func Listen(k *Keeper, key string, open func() (net.Listener, error)) (net.Listener, error) {
	return claim(k, key, open, net.FileListener)
}

// ListenPacket is Listen for a datagram socket.
func ListenPacket(k *Keeper, key string, open func() (net.PacketConn, error)) (net.PacketConn, error) {
	return claim(k, key, open, net.FilePacketConn)
}

func claim[T any](k *Keeper, key string, open func() (T, error), from func(*os.File) (T, error)) (T, error) {
	if k == nil {
		return open()
	}
	if v, err := reuse(k, key, from); err == nil {
		return v, nil
	}
	v, err := open()
	if errors.Is(err, syscall.EADDRINUSE) && k.fetch(key) {
		// Another worker left it with the parent after this one started (a spec
		// changed during an upgrade): serve that one.
		return reuse(k, key, from)
	}
	if err != nil {
		return v, err
	}
	if sc, ok := any(v).(syscall.Conn); ok {
		k.leave(key, sc)
	}
	return v, nil
}

// fetch asks the parent for key's descriptor; true when it had one.
func (k *Keeper) fetch(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.receive(opGet, key) == nil && k.kept[key] != nil
}

// errNotKept is reuse's answer for a key nothing is kept under.
var errNotKept = errors.New("not kept")

// reuse serves the socket kept under key anew. A kept socket that cannot be
// served (not the kind asked for) is let go, so that a fresh one takes its key.
func reuse[T any](k *Keeper, key string, from func(*os.File) (T, error)) (T, error) {
	var zero T
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.kept[key]
	if e == nil {
		return zero, errNotKept
	}
	nfd, err := unix.FcntlInt(uintptr(e.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return zero, err
	}
	f := os.NewFile(uintptr(nfd), key)
	defer f.Close() // from has a descriptor of its own
	v, err := from(f)
	if err != nil {
		k.dropLocked(key)
		return zero, err
	}
	e.refs++
	return v, nil
}

// leave gives the parent a copy of the socket sc holds, under key. Should the
// parent be gone, the worker serves on: it is being stopped (its parent-death
// signal), and its sockets end with it.
func (k *Keeper) leave(key string, sc syscall.Conn) {
	fd, err := dup(sc)
	if err != nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	_ = k.l.send(opHold, key, fd)
	k.replace(key, &entry{fd: fd, refs: 1})
}

// Release says one user of key's socket is done with it; when none is left, the
// parent lets it go, and the socket closes once its last listener does.
func (k *Keeper) Release(key string) {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.kept[key]
	if e == nil {
		return
	}
	// Before Prune, a socket taken from the parent waits unclaimed, whatever a
	// start that failed did with it: a last good spec restored after it (a file
	// that can no longer be served, say) serves it.
	if e.refs--; e.refs <= 0 && (k.pruned || !e.taken) {
		k.dropLocked(key)
	}
}

// Forget lets key's descriptor go, however many use it.
func (k *Keeper) Forget(key string) {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dropLocked(key)
}

// Prune lets go of everything taken from the parent that nothing claimed: the
// sockets of sandboxes that are gone, the specs no longer registered.
func (k *Keeper) Prune() []string {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pruned = true
	var gone []string
	for key, e := range k.kept {
		if e.refs == 0 {
			k.dropLocked(key)
			gone = append(gone, key)
		}
	}
	return gone
}

// dropLocked closes this worker's copy of key's descriptor and waits until the
// parent has closed its own.
func (k *Keeper) dropLocked(key string) {
	e := k.kept[key]
	if e == nil {
		return
	}
	delete(k.kept, key)
	closeFD(e.fd)
	k.l.c.SetDeadline(time.Now().Add(replyTimeout))
	defer k.l.c.SetDeadline(time.Time{})
	if k.l.send(opDrop, key, -1) != nil {
		return
	}
	for {
		op, _, fd, err := k.l.recv()
		closeFD(fd)
		if err != nil || op == opAck {
			return
		}
	}
}

// Close closes this worker's copies and its end of the pair, leaving the
// parent's as they are: the worker is stopping, and the next one (or the parent,
// when egressd stops) decides what becomes of them.
func (k *Keeper) Close() {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, e := range k.kept {
		closeFD(e.fd)
		delete(k.kept, key)
	}
	k.l.Close()
}

// Keys lists the keys under prefix, claimed or not.
func (k *Keeper) Keys(prefix string) []string {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var keys []string
	for key := range k.kept {
		if strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
	}
	return keys
}

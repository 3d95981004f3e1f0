package keep

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Store is the parent's side: the descriptors its workers left, by key. Each
// worker has a pair of its own (Attach); whatever one leaves, the next one may
// take. Safe for concurrent use.
type Store struct {
	mu     sync.Mutex
	fds    map[string]int
	closed bool
}

// NewStore returns an empty Store.
func NewStore() *Store { return &Store{fds: map[string]int{}} }

// Attach makes a pair for a new worker and serves the parent's end until the
// worker's closes (it exits). It returns the worker's end, to pass to the worker
// (exec.Cmd.ExtraFiles, named by EnvFD) and close here once it started.
func (s *Store) Attach() (*os.File, error) {
	mine, theirs, err := pair()
	if err != nil {
		return nil, err
	}
	l, err := open(mine)
	if err != nil {
		theirs.Close()
		return nil, err
	}
	go s.serve(l)
	return theirs, nil
}

// Len is how many descriptors are kept.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.fds)
}

// Close closes every kept descriptor, and any left from now on: egressd stops,
// and a sandbox's port then refuses connections, as a single process's would.
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for k, fd := range s.fds {
		unix.Close(fd)
		delete(s.fds, k)
	}
}

// serve answers one worker's messages until its end closes.
func (s *Store) serve(c *link) {
	defer c.Close()
	for {
		op, key, fd, err := c.recv()
		if err != nil {
			return
		}
		switch op {
		case opRequest:
			err = s.handOver(c, "")
		case opGet:
			closeFD(fd)
			if key == "" {
				err = c.send(opEnd, "", -1)
			} else {
				err = s.handOver(c, key)
			}
		case opHold:
			s.hold(key, fd)
		case opDrop:
			closeFD(fd)
			s.drop(key)
			err = c.send(opAck, "", -1)
		default:
			closeFD(fd)
		}
		if err != nil {
			return
		}
	}
}

// handOver sends a copy of every kept descriptor (only key's, when key is set),
// then opEnd. The copies are made under the lock and sent outside it: a worker
// that reads slowly delays no other.
func (s *Store) handOver(c *link, key string) error {
	s.mu.Lock()
	copies := make(map[string]int, len(s.fds))
	for k, fd := range s.fds {
		if key != "" && k != key {
			continue
		}
		if nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0); err == nil {
			copies[k] = nfd
		}
	}
	s.mu.Unlock()
	var err error
	for k, fd := range copies {
		if err == nil {
			err = c.send(opHold, k, fd)
		}
		unix.Close(fd)
	}
	if err != nil {
		return err
	}
	return c.send(opEnd, "", -1)
}

// hold keeps fd under key, in place of what was kept there.
func (s *Store) hold(key string, fd int) {
	if fd < 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		unix.Close(fd)
		return
	}
	if old, ok := s.fds[key]; ok {
		unix.Close(old)
	}
	s.fds[key] = fd
}

func (s *Store) drop(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fd, ok := s.fds[key]; ok {
		unix.Close(fd)
		delete(s.fds, key)
	}
}

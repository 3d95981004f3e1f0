package sockets

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/coreos/go-systemd/v22/activation"
)

// EnvWorker names the sockets a worker inherits, in descriptor order from fd 3:
// "NAME:NETWORK" separated by commas. The supervising parent sets it; a process
// that finds it set is a worker.
const EnvWorker = "EGRESSD_WORKER_SOCKETS"

// firstFD is the first inherited descriptor, as in systemd's protocol
// (SD_LISTEN_FDS_START): 0 to 2 are stdin, stdout and stderr.
const firstFD = 3

// Handover duplicates every socket of the set for a worker: files to pass as
// exec.Cmd.ExtraFiles (the first at fd 3), and the EnvWorker value naming them.
// The set's own sockets may be closed afterwards: the files keep them open.
func (set *Set) Handover() ([]*os.File, string, error) {
	files := make([]*os.File, 0, set.Len())
	names := make([]string, 0, set.Len())
	for _, s := range set.socks {
		f, err := s.file()
		if err != nil {
			closeFiles(files)
			return nil, "", err
		}
		files = append(files, f)
		names = append(names, s.Name+":"+s.Network)
	}
	return files, strings.Join(names, ","), nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// FromEnv rebuilds the sockets EnvWorker names from the descriptors this process
// inherited, and unsets the variable. It returns nil when the variable is unset:
// the process is not a worker.
func FromEnv() (*Set, error) {
	v, ok := os.LookupEnv(EnvWorker)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(EnvWorker)
	if v == "" {
		return nil, fmt.Errorf("%s: %w", EnvWorker, errNoSockets)
	}
	set := &Set{}
	for i, entry := range strings.Split(v, ",") {
		name, network, _ := strings.Cut(entry, ":")
		s, err := fromFile(os.NewFile(uintptr(firstFD+i), name), name)
		if err == nil && s.Network != network {
			err = fmt.Errorf("a %s socket, want %s", s.Network, network)
		}
		if err != nil {
			set.Close()
			return nil, fmt.Errorf("%s: fd %d (%s): %w", EnvWorker, firstFD+i, name, err)
		}
		set.Add(s)
	}
	return set, nil
}

// fromFile rebuilds the socket f holds, named name, and closes f (the listener
// or socket has a descriptor of its own).
func fromFile(f *os.File, name string) (*Socket, error) {
	if f == nil {
		return nil, errors.New("not an open descriptor")
	}
	defer f.Close()
	if ln, err := net.FileListener(f); err == nil {
		if _, ok := ln.(*net.TCPListener); ok {
			return newListener(name, ln), nil
		}
		ln.Close()
		return nil, errors.New("not a TCP listener")
	}
	pc, err := net.FilePacketConn(f)
	if err != nil {
		return nil, errors.New("neither a listening TCP socket nor a UDP socket")
	}
	if _, ok := pc.(*net.UDPConn); !ok {
		pc.Close()
		return nil, errors.New("not a UDP socket")
	}
	return newPacketConn(name, pc), nil
}

// Activated takes the sockets systemd passed (socket activation: LISTEN_PID,
// LISTEN_FDS), unnamed, so Take matches each by its address alone; it unsets the
// variables. A descriptor that is neither a TCP listener nor a UDP socket is an
// error: the .socket unit says something egressd cannot serve.
func Activated() (*Set, error) {
	files := activation.Files(true)
	set := &Set{}
	for i, f := range files {
		s, err := fromFile(f, "")
		if err != nil {
			set.Close()
			closeFiles(files[i+1:])
			return nil, fmt.Errorf("socket activation: fd %d (%s): %w", firstFD+i, f.Name(), err)
		}
		set.Add(s)
	}
	return set, nil
}

// Package netns opens listening sockets inside another network namespace (a
// sandbox's, named by a path such as /var/run/netns/sbx-42) from a process that
// stays in its own. A socket keeps the namespace it was created in, so egressd
// serves it like any other while only that namespace can reach it.
//
// The way in is Istio ztunnel's for its in-pod mode: on one OS thread, enter the
// target namespace (setns), create the socket, return to the process's own
// namespace, which was opened once and is held open so the return never depends on
// a path. Unlike ztunnel, which aborts when the return fails, a thread whose return
// failed is left locked to a goroutine that ends, so the Go runtime destroys it
// rather than scheduling other work in the sandbox's namespace.
package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// home is the process's own network namespace, opened at the first use and held
// open for the process's life.
var home = sync.OnceValues(func() (*os.File, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return os.Open("/proc/thread-self/ns/net")
})

// Do runs fn on an OS thread inside the network namespace at path, and returns
// fn's error or why the namespace could not be entered. Only what fn does at once
// happens there: sockets fn creates stay in the namespace, goroutines it starts do
// not.
func Do(path string, fn func() error) error {
	self, err := home()
	if err != nil {
		return fmt.Errorf("netns: this process's own namespace: %w", err)
	}
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() { errc <- enter(self, target, path, fn) }()
	return <-errc
}

// enter runs fn in target on a thread of its own, then returns the thread to self.
// It runs on a goroutine that ends when it returns: a thread left in target stays
// locked to it and dies with it.
func enter(self, target *os.File, path string, fn func() error) error {
	runtime.LockOSThread()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread() // still in the process's own namespace
		return fmt.Errorf("netns: entering %s: %w", path, err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("netns: returning from %s (the thread is discarded): %w", path, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Listen opens a TCP listener on address inside the namespace at path ("" means
// the process's own).
func Listen(path, network, address string) (net.Listener, error) {
	var ln net.Listener
	err := in(path, func() (err error) {
		ln, err = (&net.ListenConfig{}).Listen(context.Background(), network, address)
		return err
	})
	return ln, err
}

// ListenPacket opens a UDP socket on address inside the namespace at path (""
// means the process's own).
func ListenPacket(path, network, address string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := in(path, func() (err error) {
		pc, err = (&net.ListenConfig{}).ListenPacket(context.Background(), network, address)
		return err
	})
	return pc, err
}

func in(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return Do(path, fn)
}

package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/peeruid"
	"github.com/egressd/egressd/internal/sockets"
)

// The names of the sockets that are not listeners'. A listener's is
// listenerSocket(name): a listener may be called "admin" or "dns".
const (
	adminSocket  = "admin"
	healthSocket = "health"
	dnsSocket    = "dns" // a UDP and a TCP socket on one port
)

func listenerSocket(name string) string { return "listener/" + name }

// socketSpec is one socket a config serves, with what an error about it names:
// the listener and the config key of its address.
type socketSpec struct {
	sockets.Spec
	listener, key string
}

// socketSpecs lists the sockets l serves: the listeners in config order, the
// admin and health listeners (TCP ones: a Unix socket is the worker's own, see
// listenUnix), the DNS guard's UDP and TCP sockets.
func socketSpecs(l *Loaded) []socketSpec {
	var specs []socketSpec
	for i, lc := range l.Cfg.Listeners {
		specs = append(specs, socketSpec{sockets.Spec{Name: listenerSocket(lc.Name), Network: sockets.TCP, Addr: lc.Address},
			lc.Name, fmt.Sprintf("listeners[%d].address", i)})
	}
	if a := l.Cfg.Admin; a.Address.IsValid() {
		specs = append(specs, socketSpec{sockets.Spec{Name: adminSocket, Network: sockets.TCP, Addr: a.Address},
			"admin", "admin.address"})
	}
	if a := l.Cfg.Admin; a.HealthAddress.IsValid() {
		specs = append(specs, socketSpec{sockets.Spec{Name: healthSocket, Network: sockets.TCP, Addr: a.HealthAddress},
			"health", "admin.health_address"})
	}
	if dns, err := netip.ParseAddrPort(l.Cfg.DNS.Listen); err == nil {
		for _, network := range []string{sockets.UDP, sockets.TCP} {
			specs = append(specs, socketSpec{sockets.Spec{Name: dnsSocket, Network: network, Addr: dns}, "dns", "dns.listen"})
		}
	}
	return specs
}

// OpenSockets opens every socket the config at cfgPath (loaded as l) serves,
// taking from held those it already holds (systemd's, or a worker's inherited
// ones) and opening the rest; it returns them all and the specs of those it
// opened itself. What held still has afterwards, no spec of l wanted. The
// supervising parent calls it once; a worker's Start, for whatever its config
// names that the parent does not hold.
func OpenSockets(cfgPath string, l *Loaded, held *sockets.Set) (*sockets.Set, []sockets.Spec, error) {
	set := &sockets.Set{}
	var opened []sockets.Spec
	specs := socketSpecs(l)
	for i := 0; i < len(specs); i++ {
		var got []*sockets.Socket
		var fresh []sockets.Spec
		var err error
		if specs[i].Name == dnsSocket {
			got, fresh, err = openDNS(specs[i], held)
			i++ // its TCP twin, which follows it
		} else {
			got, fresh, err = openOne(specs[i], held)
		}
		if err != nil {
			set.Close()
			return nil, nil, listenError(specs[i], cfgPath, err)
		}
		for _, s := range got {
			set.Add(s)
		}
		opened = append(opened, fresh...)
	}
	return set, opened, nil
}

// openOne takes sp's socket from held, or opens it.
func openOne(sp socketSpec, held *sockets.Set) ([]*sockets.Socket, []sockets.Spec, error) {
	if s := held.Take(sp.Spec); s != nil {
		return []*sockets.Socket{s}, nil, nil
	}
	s, err := sockets.Listen(sp.Spec)
	if err != nil {
		return nil, nil, err
	}
	return []*sockets.Socket{s}, []sockets.Spec{sp.Spec}, nil
}

// openDNS takes or opens the DNS guard's UDP socket (udp) and its TCP twin, on
// one port: when held has only one of them, the other is opened on its port.
func openDNS(udp socketSpec, held *sockets.Set) ([]*sockets.Socket, []sockets.Spec, error) {
	tcp := udp
	tcp.Network = sockets.TCP
	u, t := held.Take(udp.Spec), held.Take(tcp.Spec)
	var err error
	switch {
	case u == nil && t == nil:
		if u, t, err = sockets.Pair(dnsSocket, udp.Addr); err != nil {
			return nil, nil, err
		}
		return []*sockets.Socket{u, t}, []sockets.Spec{u.Spec, t.Spec}, nil
	case u == nil:
		udp.Addr = t.Addr
		if u, err = sockets.Listen(udp.Spec); err != nil {
			t.Close()
			return nil, nil, err
		}
		return []*sockets.Socket{u, t}, []sockets.Spec{u.Spec}, nil
	case t == nil:
		tcp.Addr = u.Addr
		if t, err = sockets.Listen(tcp.Spec); err != nil {
			u.Close()
			return nil, nil, err
		}
		return []*sockets.Socket{u, t}, []sockets.Spec{t.Spec}, nil
	}
	return []*sockets.Socket{u, t}, nil, nil
}

// listenError names the listener that could not listen, the config key of its
// address, and the fix for the common causes; for a port in use, the process
// that holds it, when /proc shows it.
func listenError(sp socketSpec, cfgPath string, err error) error {
	where := sp.key
	if cfgPath != "" {
		where += " in " + cfgPath
	}
	fix := "change " + where
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		who := "another process holds the port (another egressd, or `make run`, still running?)"
		if holder := holderOf(sp); holder != "" {
			who = fmt.Sprintf("another process holds the port: %s is in use by %s", sp.Addr, holder)
		}
		fix = who + "; stop it or " + fix
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		fix = "no interface has that address (a transparent listener needs the namespace's host-side address up first); " + fix
	case errors.Is(err, syscall.EACCES):
		fix = "ports below 1024 need CAP_NET_BIND_SERVICE; " + fix
	}
	return fmt.Errorf("listener %q (%s): %w: %s", sp.listener, sp.key, err, fix)
}

// holderOf is the process holding sp's port (sockets.Holder); for the DNS guard,
// whose UDP and TCP sockets open together, on either network.
func holderOf(sp socketSpec) string {
	if sp.Name != dnsSocket {
		return sockets.Holder(sp.Network, sp.Addr)
	}
	for _, network := range []string{sockets.UDP, sockets.TCP} {
		if h := sockets.Holder(network, sp.Addr); h != "" {
			return h
		}
	}
	return ""
}

// listenUnix listens on the Unix socket at path (admin.address or
// admin.health_address unix://...), mode 0600: only egressd's own user (and
// root) may connect. A socket left by a worker that died is replaced; any other
// file there is an error. The worker opens it itself: the admin API is not what
// the sandbox's connections wait for during a restart.
func listenUnix(path, key string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s: %s exists and is not a socket; remove it or change %s", key, path, key)
		}
		os.Remove(path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return ln, nil
}

// admitPeers returns ln, or, when lc names peer_uids, ln admitting only the
// connections of processes running as one of them (package peeruid), looked up in
// the namespace at netnsPath ("" for egressd's own). On an error ln is left open:
// the caller closes it with the rest.
func admitPeers(ln net.Listener, netnsPath string, lc config.Listener, log zerolog.Logger) (net.Listener, error) {
	if lc.PeerUIDs == nil {
		return ln, nil
	}
	w, err := peeruid.Wrap(ln, netnsPath, lc.PeerUIDs, lc.Name, log)
	if err != nil {
		return ln, err
	}
	return w, nil
}

package egressdtest

import "net"

// FreePorts returns n ports on 127.0.0.1 that were free a moment ago, for a config
// that must name egressd's own ports before it starts (the self-guard cases
// allowlist them, so that only the self check refuses them). Another process may
// take one meanwhile; a test that cannot bear that must not use fixed ports.
func FreePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

package mitm

import (
	"crypto/tls"
	"slices"
	"strings"
	"sync"
	"testing"
)

// tlsVersions are the versions the leaves serve, for tests that run on both.
var tlsVersions = []struct {
	name string
	v    uint16
}{{"TLS1.2", tls.VersionTLS12}, {"TLS1.3", tls.VersionTLS13}}

// TestSessionResumes: a client that keeps a session cache resumes on its next
// connections, each served by a config of its own as the proxy makes one per
// connection (the first while the host is not yet cached, the next once it is).
func TestSessionResumes(t *testing.T) {
	for _, ver := range tlsVersions {
		t.Run(ver.name, func(t *testing.T) {
			ca := testCA(t, caValidity)
			l := NewLeaves(ca, LeafOptions{})
			client := &tls.Config{ServerName: "api.example.com", RootCAs: ca.pool(), MaxVersion: ver.v,
				ClientSessionCache: tls.NewLRUClientSessionCache(4)}
			for i := range 3 {
				st, err := handshake(t, l.ServerConfig("api.example.com", nil), client)
				if err != nil {
					t.Fatal(err)
				}
				if st.DidResume != (i > 0) || st.Version != ver.v {
					t.Errorf("connection %d: DidResume %v version %x, want resumed from the second on", i+1, st.DidResume, st.Version)
				}
				if cn := st.PeerCertificates[0].Subject.CommonName; cn != "api.example.com" {
					t.Errorf("connection %d: session's leaf is for %q", i+1, cn)
				}
			}
		})
	}
}

// anyKeyCache hands every lookup the last session stored, whatever server name
// it was stored under: a client that offers one host's ticket to another.
type anyKeyCache struct {
	mu   sync.Mutex
	last *tls.ClientSessionState
}

func (c *anyKeyCache) Get(string) (*tls.ClientSessionState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.last != nil
}

func (c *anyKeyCache) Put(_ string, cs *tls.ClientSessionState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cs != nil {
		c.last = cs
	}
}

// TestSessionResumesOnlyForItsHost: a ticket from a connection to one host opens no
// session on a connection to another. The client here skips verification,
// which also skips the Go client's own check that a cached session's leaf
// names the server, so only egressd's binding stands between the ticket and a
// session authenticated by the wrong host's leaf.
func TestSessionResumesOnlyForItsHost(t *testing.T) {
	for _, ver := range tlsVersions {
		t.Run(ver.name, func(t *testing.T) {
			l := NewLeaves(testCA(t, caValidity), LeafOptions{})
			cache := &anyKeyCache{}
			for i, host := range []string{"a.example.com", "b.example.com", "b.example.com"} {
				client := &tls.Config{ServerName: host, InsecureSkipVerify: true, MaxVersion: ver.v, ClientSessionCache: cache}
				st, err := handshake(t, l.ServerConfig(host, nil), client)
				if err != nil {
					t.Fatal(err)
				}
				// The third offers b's own ticket: it resumes, so the cache does offer tickets.
				if want := i == 2; st.DidResume != want {
					t.Errorf("connection %d to %s: DidResume %v, want %v", i+1, host, st.DidResume, want)
				}
				if cn := st.PeerCertificates[0].Subject.CommonName; cn != host {
					t.Errorf("connection %d to %s: authenticated by the leaf for %q", i+1, host, cn)
				}
			}
		})
	}
}

// TestLeafSuites: TLS 1.2 negotiates each AEAD suite of leafSuites, and a
// client offering only CBC suites gets no handshake.
func TestLeafSuites(t *testing.T) {
	ca := testCA(t, caValidity)
	l := NewLeaves(ca, LeafOptions{})
	for _, suite := range leafSuites {
		client := &tls.Config{ServerName: "api.example.com", RootCAs: ca.pool(), MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{suite}}
		st, err := handshake(t, l.ServerConfig("api.example.com", nil), client)
		if err != nil || st.CipherSuite != suite {
			t.Errorf("%s: suite %s, %v", tls.CipherSuiteName(suite), tls.CipherSuiteName(st.CipherSuite), err)
		}
	}
	client := &tls.Config{ServerName: "api.example.com", RootCAs: ca.pool(), MaxVersion: tls.VersionTLS12, CipherSuites: cbcSuites}
	st, err := handshake(t, l.ServerConfig("api.example.com", nil), client)
	if err == nil || !strings.Contains(err.Error(), "handshake failure") {
		t.Errorf("CBC-only client: suite %s, err %v; want alert handshake_failure", tls.CipherSuiteName(st.CipherSuite), err)
	}
	for _, s := range tls.CipherSuites() {
		if slices.Contains(leafSuites, s.ID) && (strings.Contains(s.Name, "CBC") || !slices.Contains(s.SupportedVersions, tls.VersionTLS12)) {
			t.Errorf("leafSuites holds %s", s.Name)
		}
	}
}

// cbcSuites are the ECDHE-ECDSA CBC suites crypto/tls knows (the SHA-1 ones are
// in its default list).
var cbcSuites = func() []uint16 {
	var ids []uint16
	for _, s := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		if strings.HasPrefix(s.Name, "TLS_ECDHE_ECDSA_") && strings.Contains(s.Name, "_CBC_") {
			ids = append(ids, s.ID)
		}
	}
	if len(ids) == 0 {
		panic("no ECDHE-ECDSA CBC suite in crypto/tls")
	}
	return ids
}()

// BenchmarkHandshake is one handshake with a leaf's config, both ends in
// process over loopback TCP: full (the client keeps no sessions) or resumed (it
// offers the session of the handshake before).
func BenchmarkHandshake(b *testing.B) {
	ca := testCA(b, caValidity)
	l := NewLeaves(ca, LeafOptions{})
	for _, ver := range tlsVersions {
		for _, resume := range []bool{false, true} {
			name := ver.name + "/full"
			client := &tls.Config{ServerName: "api.example.com", RootCAs: ca.pool(), MaxVersion: ver.v}
			if resume {
				name = ver.name + "/resumed"
				client.ClientSessionCache = tls.NewLRUClientSessionCache(1)
			}
			b.Run(name, func(b *testing.B) {
				mustHandshake(b, l.ServerConfig("api.example.com", nil), client) // the session to resume
				for b.Loop() {
					if st := mustHandshake(b, l.ServerConfig("api.example.com", nil), client); st.DidResume != resume {
						b.Fatalf("DidResume %v", st.DidResume)
					}
				}
			})
		}
	}
}

func mustHandshake(b *testing.B, server, client *tls.Config) tls.ConnectionState {
	st, err := handshake(b, server, client)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

package mitm

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for LeafOptions' zero values.
const (
	// DefaultLeafValidity is how long a minted leaf is valid, capped at the
	// CA's NotAfter. A day keeps a leaf lifted from memory short-lived while
	// a busy host is re-minted about once a day.
	DefaultLeafValidity = 24 * time.Hour
	// DefaultLeafCacheSize bounds the leaves kept in memory (each a key, a
	// DER chain and a parsed certificate). An agent rarely talks to more
	// hosts than this; beyond it the least recently used leaf is dropped.
	DefaultLeafCacheSize = 4096
	// DefaultMintConcurrency bounds how many leaves are minted at once.
	// Minting is CPU work (a key, a signature, a parse); bounding it means a
	// flood of new hosts queues instead of starving the proxy's other work.
	DefaultMintConcurrency = 4
)

// maxRefresh is how close to expiry a cached leaf may come before a lookup
// re-mints it (or Validity/4 when that is shorter), so a handshake never gets
// a leaf that expires during the connection's first hour.
const maxRefresh = time.Hour

// LeafOptions bound the leaf cache. Zero values mean the Default constants.
type LeafOptions struct {
	Validity        time.Duration // DefaultLeafValidity
	CacheSize       int           // DefaultLeafCacheSize
	MintConcurrency int           // DefaultMintConcurrency
	// MintsPerClient bounds the mints one client has running or waiting for a
	// slot, so that one client's flood of new names leaves the other slots to
	// others. A client is a sandbox in node mode (whose code can pick any of its
	// loopback addresses as a source), else a client address. Zero: half of
	// MintConcurrency, at least 1.
	MintsPerClient int
	// OnLookup, if set, is called once per Get: hit is false exactly when that
	// call minted (or failed to mint) a leaf; a Get served from the cache or
	// by a mint another Get had started is a hit. For leaf_cache_total{result}.
	OnLookup func(hit bool)
}

// Leaves mints leaf certificates signed by a CA and keeps them in a bounded
// LRU cache keyed by host, re-checking expiry on every hit (martian's
// mitm.Config does the same). Safe for concurrent use.
//
// Pinned hosts (PinFor: the hosts of hook URLs, of every sandbox a node serves)
// are kept apart from the LRU: no number of other names evicts their leaves, and
// their mints never wait for a mint slot, so a flood of new TLS names cannot
// delay a hook call. Other mints are bounded per client too (ServerConfigFor,
// MintsPerClient), so one client's flood leaves mint slots to the others.
type Leaves struct {
	ca        *CA
	validity  time.Duration
	refresh   time.Duration // a hit expiring within this is re-minted
	size      int
	onLookup  func(hit bool)
	sem       chan struct{} // mint slots
	perClient int           // MintsPerClient
	// tickets only holds the session-ticket keys that every connection's
	// config seals and opens tickets with (sessionFuncs); it serves no
	// connection. crypto/tls rotates them, in memory only: a new key every
	// day, each kept for a week.
	tickets *tls.Config

	mu       sync.Mutex
	lru      list.List                // of *leafEntry, most recently used first
	byHost   map[string]*list.Element // into lru
	flight   map[string]*mintCall     // mints in progress (singleflight)
	pinned   map[string]*leafEntry    // pins' hosts, outside the LRU; cert nil until minted
	pins     map[string][]string      // each owner's pinned hosts (PinFor)
	byClient map[mintKey]*clientMints // clients with mints running or waiting

	now   func() time.Time // time.Now; tests move the clock
	mints atomic.Int64     // leaves minted; tests count them
}

type leafEntry struct {
	host string
	cert *tls.Certificate
	// funcs are the host-bound callbacks ServerConfig hands out, made once
	// per entry so ServerConfig allocates only the tls.Config.
	funcs hostFuncs
}

// hostFuncs are the callbacks of a tls.Config that terminates connections to
// one host: its leaf, and its session tickets (sessionFuncs).
type hostFuncs struct {
	getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	wrap    func(tls.ConnectionState, *tls.SessionState) ([]byte, error)
	unwrap  func([]byte, tls.ConnectionState) (*tls.SessionState, error)
}

// mintKey is a client whose mints MintsPerClient bounds: a sandbox (node
// mode), or a client address.
type mintKey struct {
	sandbox string
	ip      netip.Addr
}

// clientMints are one client's mints running or waiting for a slot.
type clientMints struct {
	slots chan struct{} // MintsPerClient of them
	users int           // mints holding or waiting for a slot; the entry goes at 0
}

type mintCall struct {
	done chan struct{} // closed when cert and err are set
	cert *tls.Certificate
	err  error
}

// NewLeaves returns a leaf cache for ca, which must not be nil.
func NewLeaves(ca *CA, o LeafOptions) *Leaves {
	l := &Leaves{
		ca:       ca,
		validity: positiveOr(o.Validity, DefaultLeafValidity),
		size:     positiveOr(o.CacheSize, DefaultLeafCacheSize),
		onLookup: o.OnLookup,
		byHost:   make(map[string]*list.Element),
		flight:   make(map[string]*mintCall),
		pinned:   make(map[string]*leafEntry),
		pins:     make(map[string][]string),
		byClient: make(map[mintKey]*clientMints),
		tickets:  &tls.Config{},
		now:      time.Now,
	}
	l.refresh = min(maxRefresh, l.validity/4)
	l.sem = make(chan struct{}, positiveOr(o.MintConcurrency, DefaultMintConcurrency))
	l.perClient = positiveOr(o.MintsPerClient, max(1, cap(l.sem)/2))
	return l
}

// CA returns the CA the leaves are signed by.
func (l *Leaves) CA() *CA { return l.ca }

// Get returns the leaf for host, a normalised DNS name or IP literal: an ECDSA
// P-256 key of its own, host as the only SAN and as CommonName, valid from an
// hour ago for Validity (never past the CA's NotAfter), for server auth, with
// the chain [leaf, CA] and Leaf set. Concurrent Gets for a missing host mint
// once; distinct hosts mint in parallel up to MintConcurrency.
func (l *Leaves) Get(host string) (*tls.Certificate, error) {
	return l.get(mintKey{}, host, l.lookup)
}

// get is Get for a client (whose mints count against MintsPerClient), reporting
// the lookup's result to count.
func (l *Leaves) get(client mintKey, host string, count func(hit bool)) (*tls.Certificate, error) {
	l.mu.Lock()
	if cert := l.cachedLocked(host); cert != nil {
		l.mu.Unlock()
		count(true)
		return cert, nil
	}
	if c, ok := l.flight[host]; ok {
		l.mu.Unlock()
		<-c.done
		count(true)
		return c.cert, c.err
	}
	c := &mintCall{done: make(chan struct{})}
	l.flight[host] = c
	_, pinned := l.pinned[host]
	l.mu.Unlock()

	count(false)
	c.cert, c.err = l.mint(client, host, pinned)

	l.mu.Lock()
	delete(l.flight, host)
	if c.err == nil {
		l.storeLocked(host, c.cert)
	}
	l.mu.Unlock()
	close(c.done)
	return c.cert, c.err
}

// ServerConfig returns the tls.Config for terminating a client connection to
// host, which egressd has already decided on (the CONNECT target or the
// checked SNI). Its GetCertificate returns host's leaf whatever SNI the client
// sends; NextProtos is used as given (not copied: do not modify it after).
// Called per intercepted connection, it allocates only the tls.Config when
// host is cached (plus three small closures otherwise) and mints nothing: the
// leaf is fetched during the handshake.
//
// TLS 1.2 offers only the AEAD suites of leafSuites. Session tickets are
// sealed with keys every config shares, so a client that reconnects resumes;
// each ticket names host, and a ticket for another host is ignored
// (sessionFuncs).
func (l *Leaves) ServerConfig(host string, nextProtos []string) *tls.Config {
	return l.ServerConfigFor("", nil, host, nextProtos)
}

// ServerConfigFor is ServerConfig for a connection of sandbox ("" outside node
// mode) from client (its remote address): a leaf it makes egressd mint counts
// against the sandbox's MintsPerClient, or the client address's.
func (l *Leaves) ServerConfigFor(sandbox string, client net.Addr, host string, nextProtos []string) *tls.Config {
	key := mintKey{sandbox: sandbox}
	if sandbox == "" {
		key.ip = clientIP(client)
	}
	f := l.hostFuncs(key, host)
	return &tls.Config{
		GetCertificate: f.getCert,
		WrapSession:    f.wrap,
		UnwrapSession:  f.unwrap,
		NextProtos:     nextProtos,
		MinVersion:     tls.VersionTLS12,
		CipherSuites:   leafSuites,
	}
}

// leafSuites are the TLS 1.2 suites the leaves offer: ECDHE key exchange for
// their ECDSA P-256 keys, with an AEAD. crypto/tls's default list also holds
// the CBC-SHA suites, whose MAC-then-encrypt is open to padding-timing attacks
// (Lucky13); TLS 1.3's suites are all AEAD and not configurable.
var leafSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
}

// sessionFuncs are the WrapSession and UnwrapSession of host's connections.
// Tickets are sealed with l.tickets' keys, shared by every connection (a config
// of its own per connection would otherwise make keys of its own, and no
// ticket would ever open again). A ticket carries host, and opens only on a
// connection to host: a client that offers it elsewhere gets a full handshake
// and that host's leaf, so a resumed session was always authenticated by the
// leaf of the tunnel's own target.
func (l *Leaves) sessionFuncs(host string) (wrap func(tls.ConnectionState, *tls.SessionState) ([]byte, error),
	unwrap func([]byte, tls.ConnectionState) (*tls.SessionState, error)) {
	wrap = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		ss.Extra = [][]byte{[]byte(host)}
		return l.tickets.EncryptTicket(cs, ss)
	}
	unwrap = func(ticket []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
		ss, err := l.tickets.DecryptTicket(ticket, cs)
		if ss == nil || err != nil || len(ss.Extra) != 1 || string(ss.Extra[0]) != host {
			return nil, err // no session: a full handshake
		}
		return ss, nil
	}
	return wrap, unwrap
}

// clientIP is the IP of a remote address; the zero Addr when it has none.
func clientIP(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	if a == nil {
		return netip.Addr{}
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap.Addr().Unmap()
}

// hostFuncs are host's callbacks: its cache entry's when it has one, else new
// ones whose leaf lookup counts against client's mints.
func (l *Leaves) hostFuncs(client mintKey, host string) hostFuncs {
	l.mu.Lock()
	if e, ok := l.pinned[host]; ok {
		l.mu.Unlock()
		return e.funcs
	}
	if el, ok := l.byHost[host]; ok {
		f := el.Value.(*leafEntry).funcs
		l.mu.Unlock()
		return f
	}
	l.mu.Unlock()
	f := hostFuncs{getCert: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return l.get(client, host, l.lookup) }}
	f.wrap, f.unwrap = l.sessionFuncs(host)
	return f
}

// cachedLocked returns host's cached leaf if it is fresh enough, marking it
// recently used. A stale entry stays until its replacement is stored.
func (l *Leaves) cachedLocked(host string) *tls.Certificate {
	if e, ok := l.pinned[host]; ok {
		if e.cert == nil || !l.fresh(e.cert.Leaf) {
			return nil
		}
		return e.cert
	}
	el, ok := l.byHost[host]
	if !ok {
		return nil
	}
	e := el.Value.(*leafEntry)
	if !l.fresh(e.cert.Leaf) {
		return nil
	}
	l.lru.MoveToFront(el)
	return e.cert
}

// fresh reports whether leaf may still be handed out: it expires after the
// refresh window, or it already runs to the CA's expiry (re-minting could not
// do better) and has not expired.
func (l *Leaves) fresh(leaf *x509.Certificate) bool {
	left := leaf.NotAfter.Sub(l.now())
	return left > l.refresh || (left > 0 && !leaf.NotAfter.Before(l.ca.Cert.NotAfter))
}

func (l *Leaves) storeLocked(host string, cert *tls.Certificate) {
	if e, ok := l.pinned[host]; ok {
		e.cert = cert
		return
	}
	if el, ok := l.byHost[host]; ok {
		el.Value.(*leafEntry).cert = cert
		l.lru.MoveToFront(el)
		return
	}
	l.byHost[host] = l.lru.PushFront(l.newEntry(host, cert))
	for l.lru.Len() > l.size {
		oldest := l.lru.Back()
		l.lru.Remove(oldest)
		delete(l.byHost, oldest.Value.(*leafEntry).host)
	}
}

// newEntry is a cache entry for host holding cert (nil: not minted yet).
func (l *Leaves) newEntry(host string, cert *tls.Certificate) *leafEntry {
	e := &leafEntry{host: host, cert: cert}
	e.funcs.getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return l.Get(host) }
	e.funcs.wrap, e.funcs.unwrap = l.sessionFuncs(host)
	return e
}

// Pin is PinFor for egressd's own config (a sidecar's, or a node's top level).
func (l *Leaves) Pin(hosts []string) error { return l.PinFor("", hosts) }

// PinFor makes hosts (normalised, as Get takes them) owner's pinned hosts (a
// sandbox's, in node mode), replacing what owner pinned before; nil unpins them.
// The pinned hosts are every owner's together, so one sandbox's pins never undo
// another's. It mints the leaves they lack at once, outside the mint queue and
// uncounted by OnLookup. A pinned leaf is never evicted; a re-mint near its
// expiry skips the queue too. Hosts no owner pins any more rejoin the LRU. It
// returns the mint errors (Get retries those hosts).
func (l *Leaves) PinFor(owner string, hosts []string) error {
	l.mu.Lock()
	if len(hosts) == 0 {
		delete(l.pins, owner)
	} else {
		l.pins[owner] = slices.Clone(hosts)
	}
	l.repinLocked()
	l.mu.Unlock()
	var errs []error
	for _, h := range hosts {
		if _, err := l.get(mintKey{}, h, func(bool) {}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// repinLocked makes the pinned set every owner's hosts: a newly pinned host
// takes its cached leaf out of the LRU, one no longer pinned goes back to it.
func (l *Leaves) repinLocked() {
	old := l.pinned
	l.pinned = make(map[string]*leafEntry, len(old))
	for _, hosts := range l.pins {
		for _, h := range hosts {
			if _, done := l.pinned[h]; done {
				continue
			}
			e, ok := old[h]
			if !ok {
				e = l.newEntry(h, nil)
				if el, cached := l.byHost[h]; cached {
					e.cert = el.Value.(*leafEntry).cert
					l.lru.Remove(el)
					delete(l.byHost, h)
				}
			}
			l.pinned[h] = e
		}
	}
	for h, e := range old {
		if _, still := l.pinned[h]; !still && e.cert != nil {
			l.storeLocked(h, e.cert)
		}
	}
}

func (l *Leaves) lookup(hit bool) {
	if l.onLookup != nil {
		l.onLookup(hit)
	}
}

// mint makes a leaf for host once one of client's slots and then a mint slot
// are free; a pinned host's mint takes neither (there are a few of them, and a
// hook call must not queue).
func (l *Leaves) mint(client mintKey, host string, pinned bool) (*tls.Certificate, error) {
	if !pinned {
		defer l.acquireClient(client)()
		l.sem <- struct{}{}
		defer func() { <-l.sem }()
	}
	l.mints.Add(1)
	return mintLeaf(l.ca, host, l.now(), l.validity)
}

// acquireClient takes one of client's MintsPerClient slots, waiting for one, and
// returns its release.
func (l *Leaves) acquireClient(client mintKey) (release func()) {
	l.mu.Lock()
	cm, ok := l.byClient[client]
	if !ok {
		cm = &clientMints{slots: make(chan struct{}, l.perClient)}
		l.byClient[client] = cm
	}
	cm.users++
	l.mu.Unlock()
	cm.slots <- struct{}{}
	return func() {
		<-cm.slots
		l.mu.Lock()
		if cm.users--; cm.users == 0 {
			delete(l.byClient, client)
		}
		l.mu.Unlock()
	}
}

// mintLeaf signs a leaf for host with ca, valid from now-backdate for validity
// but within the CA's own validity.
func mintLeaf(ca *CA, host string, now time.Time, validity time.Duration) (*tls.Certificate, error) {
	tmpl, err := leafTemplate(host)
	if err != nil {
		return nil, err
	}
	tmpl.NotBefore = now.Add(-backdate)
	if tmpl.NotBefore.Before(ca.Cert.NotBefore) {
		tmpl.NotBefore = ca.Cert.NotBefore
	}
	tmpl.NotAfter = now.Add(validity)
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	if !tmpl.NotAfter.After(now) {
		return nil, fmt.Errorf("interception CA %q expired at %s", ca.Cert.Subject.CommonName, ca.Cert.NotAfter.Format(time.RFC3339))
	}
	if tmpl.SerialNumber, err = randomSerial(); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("minting leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// leafTemplate is a server-auth leaf naming exactly host: an IP SAN for an IP
// literal, else a DNS SAN.
func leafTemplate(host string) (*x509.Certificate, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: host},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return nil, fmt.Errorf("leaf host %q: an IP with a zone cannot be certified", host)
		}
		tmpl.IPAddresses = []net.IP{ip.AsSlice()}
		return tmpl, nil
	}
	if err := checkDNSName(host); err != nil {
		return nil, err
	}
	tmpl.DNSNames = []string{host}
	return tmpl, nil
}

// checkDNSName rejects what cannot be a normalised host name: empty labels,
// ports, brackets, wildcards and anything outside letters, digits, '-', '_'.
func checkDNSName(host string) error {
	if host == "" || len(host) > 253 {
		return errors.New("leaf host: empty or longer than 253 bytes")
	}
	for label := range strings.SplitSeq(host, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("leaf host %q: empty or over-long label", host)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("leaf host %q: not a normalised DNS name or IP literal", host)
			}
		}
	}
	return nil
}

func positiveOr[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

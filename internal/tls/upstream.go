// Package mitm is egressd's one home for TLS: the policy for verifying upstream
// servers now, and the CA and leaf certificates for interception.
package mitm

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
)

// UpstreamConfig is the unified policy for every TLS connection egressd makes to an
// upstream: TLS 1.2 or later, certificates always verified against the system roots
// plus the PEM bundle in caFile (may be ""). InsecureSkipVerify is never set.
//
// The roots are built once per content of caFile and shared by every Config that
// names the same bundle: a pool holds only public certificates, is never changed once
// built, and a copy of the system roots is tens of KiB, which a node serving
// hundreds of sandboxes would otherwise hold once per sandbox. The file is read on
// every call, so a changed bundle is seen at the next reload.
func UpstreamConfig(caFile string) (*tls.Config, error) {
	var pem []byte
	if caFile != "" {
		var err error
		if pem, err = os.ReadFile(caFile); err != nil {
			return nil, fmt.Errorf("tls.upstream_ca_file: %w", err)
		}
	}
	roots, err := upstreamRoots.get(caFile != "", pem)
	if err != nil {
		return nil, fmt.Errorf("tls.upstream_ca_file: %s %w", caFile, err)
	}
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, nil
}

// maxRootPools bounds the pools kept: a bundle rewritten over and over must not
// grow the cache without end. Past it the cache starts again.
const maxRootPools = 16

// rootPools are the upstream root pools built so far, by the SHA-256 of the bundle
// added to the system roots.
type rootPools struct {
	mu    sync.Mutex
	pools map[[sha256.Size]byte]*x509.CertPool
}

var upstreamRoots = &rootPools{pools: map[[sha256.Size]byte]*x509.CertPool{}}

// get returns the system roots, plus the certificates of pem when bundle (a bundle
// without any is an error), built at its first use.
func (r *rootPools) get(bundle bool, pem []byte) (*x509.CertPool, error) {
	key := sha256.Sum256(pem)
	if !bundle {
		key = [sha256.Size]byte{} // no bundle: the system roots alone
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pools[key]; p != nil {
		return p, nil
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if bundle && !roots.AppendCertsFromPEM(pem) {
		return nil, errors.New("holds no PEM certificate")
	}
	if len(r.pools) >= maxRootPools {
		clear(r.pools)
	}
	r.pools[key] = roots
	return roots, nil
}

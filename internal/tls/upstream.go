// Package mitm is egressd's one home for TLS: the policy for verifying upstream
// servers now, and the CA and leaf certificates for interception.
package mitm

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// UpstreamConfig is the unified policy for every TLS connection egressd makes to an
// upstream: TLS 1.2 or later, certificates always verified against the system roots
// plus the PEM bundle in caFile (may be ""). InsecureSkipVerify is never set.
func UpstreamConfig(caFile string) (*tls.Config, error) {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("tls.upstream_ca_file: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.upstream_ca_file: %s holds no PEM certificate", caFile)
		}
	}
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, nil
}

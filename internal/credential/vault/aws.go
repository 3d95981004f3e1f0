package vault

import (
	"context"
	"fmt"
	"time"

	"github.com/egressd/egressd/internal/credential"
)

// An aws credential with vault_aws keeps its spec in KV (or the file backend's shape, read
// from KV here) and its keys in Vault's AWS secrets engine: <mount>/sts/<role> (STS keys,
// a lease that cannot be renewed, read again ahead of expiry) or <mount>/creds/<role> (an
// IAM user's keys under a renewable lease, renewed, and revoked once replaced or at
// shutdown so that no user egressd stopped using lingers). Both go through the leased-path
// machinery of paths.go.

// Results of a read of the AWS secrets engine: the result label of
// egressd_credential_mint_total.
const (
	MintOK    = "ok"
	MintError = "error"
)

// revokeTimeout bounds the revocation of a replaced lease, and of all of them at shutdown.
const revokeTimeout = 5 * time.Second

// SetMintMetrics sets the function called after every read of the AWS secrets engine
// (one minted key pair, or a failure) with MintOK or MintError. Call it before Start.
func (b *Backend) SetMintMetrics(f func(id, result string)) { b.mint = f }

// readAWS fills sec's keys from the AWS secrets engine, served from memory until their
// refresh time. The version joins the spec's KV version and the keys' lease.
func (b *Backend) readAWS(ctx context.Context, id string, sec credential.Secret, version string) (credential.Secret, string, error) {
	va := sec.AWS.Vault
	l, err := b.readLeased(ctx, id, func(ctx context.Context) (*leased, error) {
		l, err := b.fetchAWS(ctx, id, va)
		b.countMint(id, err)
		return l, err
	})
	if err != nil {
		return credential.Secret{}, "", err
	}
	keys := *l.aws
	keys.Vault = va
	sec.AWS = &keys
	return sec, version + "+" + l.version, nil
}

// fetchAWS reads one key pair from the engine.
func (b *Backend) fetchAWS(ctx context.Context, id string, va *credential.VaultAWS) (*leased, error) {
	sec, err := b.readSecret(ctx, va.Path())
	if err != nil {
		return nil, err
	}
	a := &credential.AWS{}
	fields := map[string]*string{"access_key": &a.AccessKeyID, "secret_key": &a.SecretAccessKey}
	for f, dst := range fields {
		if *dst, _ = sec.Data[f].(string); *dst == "" {
			return nil, fmt.Errorf("credential %s: the data at %s has no %s (it has %s): %w", id, va.Path(), f, fieldNames(sec.Data), credential.ErrInvalid)
		}
	}
	a.SessionToken, _ = sec.Data["session_token"].(string)
	if a.SessionToken == "" {
		a.SessionToken, _ = sec.Data["security_token"].(string) // Vault before 1.13
	}
	l := b.newLeased(id, sec, a.AccessKeyID)
	if l.lifetime > 0 {
		a.Expires = l.expires
	}
	l.aws, l.revoke = a, va.Kind == credential.AWSKindCreds && sec.LeaseID != ""
	return l, nil
}

// replaced revokes cur's lease, in the background, when next replaces a lease that
// egressd revokes (an IAM user's keys).
func (b *Backend) replaced(cur, next *leased) {
	if cur == nil || !cur.revoke || cur.leaseID == next.leaseID {
		return
	}
	go b.revoke(cur.leaseID)
}

// revokeAll revokes every lease egressd revokes: at shutdown, once WatchIDs' ctx ended.
func (b *Backend) revokeAll() {
	b.leases.mu.Lock()
	var ids []string
	for _, l := range b.leases.byID {
		if l.revoke {
			ids = append(ids, l.leaseID)
		}
	}
	b.leases.mu.Unlock()
	for _, id := range ids {
		b.revoke(id)
	}
}

func (b *Backend) revoke(leaseID string) {
	ctx, cancel := context.WithTimeout(context.Background(), revokeTimeout)
	defer cancel()
	if err := b.client.Sys().RevokeWithContext(ctx, leaseID); err != nil {
		b.log.Warn().Err(describe("vault revoke", "sys/leases/revoke", err)).Msg("aws keys' vault lease not revoked; it ends at its TTL")
		return
	}
	b.log.Info().Msg("aws keys' vault lease revoked")
}

func (b *Backend) countMint(id string, err error) {
	switch {
	case b.mint == nil:
	case err != nil:
		b.mint(id, MintError)
	default:
		b.mint(id, MintOK)
	}
}

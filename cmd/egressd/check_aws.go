package main

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/daemon"
	"github.com/egressd/egressd/internal/placeholder"
)

// lintAWS checks what an aws credential needs of the policy: the env section gives the
// sandbox both halves of the placeholder pair, for one credential; and, where the file
// backend can be read offline, that the credentials they and the entries name are aws
// ones, that each entry naming one has an "aws" block, and that vault_aws is not asked
// of a backend that is not Vault.
func lintAWS(l *daemon.Loaded) []config.Problem {
	out := lintAWSEnv(l)
	secrets := awsSecrets(l)
	if secrets == nil {
		return out
	}
	file := l.Cfg.Policy.File
	if id := l.Policy.Env[placeholder.EnvAWSAccessKeyID]; id != "" && secrets[id] == nil {
		out = append(out, config.Problem{Path: "env." + placeholder.EnvAWSAccessKeyID, File: file, Msg: fmt.Sprintf(
			`credential %q is not of type aws: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY name an {"type": "aws", ...} credential`, id)})
	}
	prefix := allowlistPrefix(file)
	for _, r := range l.Policy.Allowlist.Rules() {
		a := secrets[r.Credential]
		switch {
		case a == nil:
		case r.AWS == nil:
			out = append(out, config.Problem{Path: fmt.Sprintf("%s[%d].aws", prefix, r.Index), File: file, Msg: fmt.Sprintf(
				`required for aws credential %q: "aws": {"regions": ["us-east-1"], "services": ["s3"]} (what requests may be signed for)`, r.Credential)})
		case l.Policy.Env[placeholder.EnvAWSAccessKeyID] != r.Credential:
			out = append(out, config.Problem{Path: "env", File: file, Msg: fmt.Sprintf(
				`aws credential %q has no placeholder pair for the sandbox: add "AWS_ACCESS_KEY_ID": {"credential": %q} and "AWS_SECRET_ACCESS_KEY": {"credential": %q}`,
				r.Credential, r.Credential, r.Credential)})
		case a.Vault != nil && l.Cfg.Credentials.Backend != config.BackendVault:
			out = append(out, config.Problem{Path: r.Credential, File: l.Cfg.Credentials.File, Msg: fmt.Sprintf(
				`aws credential %q reads its keys from Vault's AWS secrets engine (vault_aws): set credentials.backend: vault, or give "access_key_id" and "secret_access_key"`, r.Credential)})
		}
	}
	return out
}

// lintAWSEnv: the pair's two variables go together and name one credential.
func lintAWSEnv(l *daemon.Loaded) []config.Problem {
	id, secret := l.Policy.Env[placeholder.EnvAWSAccessKeyID], l.Policy.Env[placeholder.EnvAWSSecretAccessKey]
	if id == secret {
		return nil
	}
	return []config.Problem{{Path: "env", File: l.Cfg.Policy.File, Msg: fmt.Sprintf(
		`AWS_ACCESS_KEY_ID names credential %q and AWS_SECRET_ACCESS_KEY %q: both must name the same aws credential`, id, secret)}}
}

// awsSecrets reads, from the file backend, the credentials the policy names: the aws
// part of each (nil for one of another type). Nil when the backend is not read offline.
func awsSecrets(l *daemon.Loaded) map[string]*credential.AWS {
	if l.Cfg.Credentials.Backend != config.BackendFile {
		return nil
	}
	b, err := daemon.NewBackend(l, zerolog.Nop())
	if err != nil {
		return nil
	}
	out := map[string]*credential.AWS{}
	for _, ref := range credentialRefs(l) {
		if sec, _, err := b.Read(context.Background(), ref.id); err == nil {
			out[ref.id] = sec.AWS
		}
	}
	if id := l.Policy.Env[placeholder.EnvAWSAccessKeyID]; id != "" {
		if sec, _, err := b.Read(context.Background(), id); err == nil {
			out[id] = sec.AWS
		}
	}
	return out
}

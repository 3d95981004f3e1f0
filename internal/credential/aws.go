package credential

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// TypeAWS is an AWS key pair that egressd signs requests with (SigV4), from the backend
// itself or from Vault's AWS secrets engine.
const TypeAWS = "aws"

// Kinds of a vault_aws source: the AWS secrets engine endpoint read.
const (
	AWSKindSTS   = "sts"   // <mount>/sts/<role>: STS credentials, no renewable lease
	AWSKindCreds = "creds" // <mount>/creds/<role>: an IAM user's keys under a lease
)

// DefaultAWSMount is vault_aws.mount when absent.
const DefaultAWSMount = "aws"

// AWS is an aws credential: static keys, or (Vault set) keys read from Vault's AWS
// secrets engine by the aws token manager, which fills in the keys and Expires. The keys
// are secrets: AWS redacts itself in every rendering.
type AWS struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string    // "" for long-lived IAM user keys
	Expires         time.Time // zero: the keys do not expire (static)
	Vault           *VaultAWS // nil: static keys from the backend
}

// VaultAWS names the AWS secrets engine role the keys are read from.
type VaultAWS struct {
	Mount string // default DefaultAWSMount
	Role  string
	Kind  string // AWSKindSTS or AWSKindCreds
}

// Path is the engine path read for the keys, e.g. "aws/sts/deploy".
func (v *VaultAWS) Path() string { return v.Mount + "/" + v.Kind + "/" + v.Role }

// awsExpirySkew is how long before their expiry keys stop being signed with, so that a
// request signed just before still arrives valid.
const awsExpirySkew = 30 * time.Second

// Usable reports whether the keys are filled in (static, or read from Vault) and, for
// keys that expire, not within awsExpirySkew of expiring at now.
func (a *AWS) Usable(now time.Time) bool {
	return a.AccessKeyID != "" && a.SecretAccessKey != "" && (a.Expires.IsZero() || now.Before(a.Expires.Add(-awsExpirySkew)))
}

// Secrets are the values that must never reach the sandbox: the key pair and the session
// token (the access key ID is not secret to AWS, but it names the real principal).
func (a *AWS) Secrets() []string {
	out := []string{a.AccessKeyID, a.SecretAccessKey}
	if a.SessionToken != "" {
		out = append(out, a.SessionToken)
	}
	return out
}

// HeaderNames are the headers a signature with these keys sets: the sandbox's copies
// are removed and set again. The security token comes with temporary keys (a session
// token, or any keys from Vault's STS endpoint).
func (a *AWS) HeaderNames() []string {
	names := []string{"Authorization", "X-Amz-Date"}
	if a.SessionToken != "" || (a.Vault != nil && a.Vault.Kind == AWSKindSTS) {
		names = append(names, "X-Amz-Security-Token")
	}
	return names
}

// String shows the source, never a key.
func (a *AWS) String() string {
	if a.Vault != nil {
		return "aws keys from vault " + a.Vault.Path()
	}
	return "aws static keys"
}

// GoString is String for %#v.
func (a *AWS) GoString() string { return "&credential.AWS{" + a.String() + "}" }

// Format implements fmt.Formatter so that no verb reaches a key.
func (a *AWS) Format(f fmt.State, verb rune) { format(f, verb, a.String(), a.GoString()) }

// MarshalJSON writes the source only.
func (a *AWS) MarshalJSON() ([]byte, error) { return json.Marshal(a.String()) }

// MarshalZerologObject writes the source only.
func (a *AWS) MarshalZerologObject(e *zerolog.Event) { e.Str("aws", a.String()) }

func parseAWS(id string, raw map[string]any) (Secret, error) {
	const typ = TypeAWS
	fields := []string{"access_key_id", "secret_access_key", "session_token", "vault_aws"}
	if err := typedFields(id, typ, raw, fields, nil); err != nil {
		return Secret{}, err
	}
	if v, ok := raw["vault_aws"]; ok {
		if _, static := raw["access_key_id"]; static {
			return Secret{}, valueErr(id, typ+`: give "access_key_id"/"secret_access_key" or "vault_aws", not both`)
		}
		va, err := parseVaultAWS(id, v)
		return Secret{Type: typ, AWS: &AWS{Vault: va}}, err
	}
	for _, k := range []string{"access_key_id", "secret_access_key"} {
		if s, ok := raw[k].(string); !ok || s == "" {
			return Secret{}, valueErr(id, typ+": "+quoteName(k)+` is required (a non-empty string), or give "vault_aws": {"role": "..."} to read the keys from Vault's AWS secrets engine`)
		}
	}
	a := &AWS{AccessKeyID: raw["access_key_id"].(string), SecretAccessKey: raw["secret_access_key"].(string)}
	var err error
	if a.SessionToken, err = optString(id, typ, raw, "session_token", ""); err != nil {
		return Secret{}, err
	}
	for k, s := range map[string]string{"access_key_id": a.AccessKeyID, "secret_access_key": a.SecretAccessKey, "session_token": a.SessionToken} {
		if s != "" && (strings.ContainsAny(s, " \t") || hasControl(s)) {
			return Secret{}, valueErr(id, typ+": "+quoteName(k)+" contains white space or a control character")
		}
	}
	return Secret{Type: typ, AWS: a}, nil
}

func parseVaultAWS(id string, v any) (*VaultAWS, error) {
	const typ = TypeAWS + ": vault_aws"
	m, ok := v.(map[string]any)
	if !ok {
		return nil, valueErr(id, typ+` must be an object such as {"mount": "aws", "role": "deploy", "kind": "sts"}`)
	}
	if err := typedFields(id, typ, m, []string{"mount", "role", "kind"}, []string{"role"}); err != nil {
		return nil, err
	}
	va := &VaultAWS{Role: m["role"].(string)}
	var err error
	if va.Mount, err = optString(id, typ, m, "mount", DefaultAWSMount); err != nil {
		return nil, err
	}
	if va.Kind, err = optString(id, typ, m, "kind", AWSKindSTS); err != nil {
		return nil, err
	}
	va.Mount = strings.Trim(va.Mount, "/")
	switch {
	case va.Kind != AWSKindSTS && va.Kind != AWSKindCreds:
		return nil, valueErr(id, typ+`: "kind" must be "sts" (assumed_role or federation_token roles) or "creds" (iam_user roles)`)
	case va.Mount == "" || strings.ContainsAny(va.Mount+va.Role, " \t?#") || strings.Contains(va.Role, "/") || hasControl(va.Mount+va.Role):
		return nil, valueErr(id, typ+`: "mount" and "role" must be Vault path segments such as "aws" and "deploy"`)
	}
	return va, nil
}

package placeholder

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
)

// The environment variables of an aws credential's placeholder key pair. In the policy's
// env section they name the aws credential ({"credential": "aws-dev"}); the sandbox's SDK
// signs with the pair and egressd signs again with the real keys (internal/sigv4).
const (
	EnvAWSAccessKeyID     = "AWS_ACCESS_KEY_ID"
	EnvAWSSecretAccessKey = "AWS_SECRET_ACCESS_KEY"
)

// IsAWSVar reports whether name is one of the placeholder key pair's variables.
func IsAWSVar(name string) bool { return name == EnvAWSAccessKeyID || name == EnvAWSSecretAccessKey }

// AWSPair is the placeholder key pair of an aws credential. Only the access key ID is
// ever checked (it must sign the sandbox's requests); the secret key is never verified,
// since egressd signs every request again.
type AWSPair struct {
	AccessKeyID     string // "AKIA" + 16 characters of [A-Z2-7]: the shape SDKs accept
	SecretAccessKey string // 40 characters, like a real secret access key
}

// DeriveAWS returns the placeholder key pair of aws credential id in environment env:
// stable across reloads and restarts, unguessable without the key (80 bits in the key ID,
// 240 in the secret), and worthless outside egressd.
func DeriveAWS(key []byte, env, id string) AWSPair {
	keyID := awsMAC(key, "aws-access-key-id", env, id)
	secret := awsMAC(key, "aws-secret-access-key", env, id)
	return AWSPair{
		AccessKeyID:     "AKIA" + base32.StdEncoding.EncodeToString(keyID[:10]),
		SecretAccessKey: base64.StdEncoding.EncodeToString(secret[:30]),
	}
}

// envValue is the pair's half that variable name holds.
func (p AWSPair) envValue(name string) string {
	if name == EnvAWSAccessKeyID {
		return p.AccessKeyID
	}
	return p.SecretAccessKey
}

func awsMAC(key []byte, label, env, id string) []byte {
	mac := hmac.New(sha256.New, key)
	for _, s := range []string{label, env, id} {
		mac.Write([]byte(s))
		mac.Write([]byte{0})
	}
	return mac.Sum(nil)
}

// AWSKeyID returns the placeholder access key ID of aws credential id when the policy's
// env section gives the sandbox its pair.
func (r *Replacer) AWSKeyID(id string) (string, bool) {
	if r == nil {
		return "", false
	}
	p, ok := r.aws[id]
	return p.AccessKeyID, ok
}

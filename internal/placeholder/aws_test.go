package placeholder

import (
	"regexp"
	"testing"
)

// TestAWSPair: the pair looks like AWS keys (SDKs check the key ID's shape), is stable
// for an environment and credential, differs across either, and is not an
// environment_variable placeholder the Replacer would refuse in an Authorization header.
func TestAWSPair(t *testing.T) {
	key := make([]byte, keyBytes)
	p := DeriveAWS(key, "env_a", "aws-dev")
	if !regexp.MustCompile(`^AKIA[A-Z2-7]{16}$`).MatchString(p.AccessKeyID) || len(p.SecretAccessKey) != 40 {
		t.Fatalf("pair %+v: want AKIA + 16 of [A-Z2-7] and a 40-character secret", p)
	}
	if DeriveAWS(key, "env_a", "aws-dev") != p || DeriveAWS(key, "env_b", "aws-dev") == p || DeriveAWS(key, "env_a", "aws-x") == p {
		t.Fatal("the pair is not a function of the environment and credential alone")
	}
	r := New(key, "env_a", map[string]string{EnvAWSAccessKeyID: "aws-dev", EnvAWSSecretAccessKey: "aws-dev"}, nil, nil)
	env := r.Env()
	if env[EnvAWSAccessKeyID] != p.AccessKeyID || env[EnvAWSSecretAccessKey] != p.SecretAccessKey {
		t.Fatalf("sandbox env %v", env)
	}
	if id, ok := r.AWSKeyID("aws-dev"); !ok || id != p.AccessKeyID {
		t.Fatalf("AWSKeyID = %q, %v", id, ok)
	}
	if r.Active() {
		t.Fatal("the aws pair is searched for as an environment_variable placeholder")
	}
}

package allowlist

import (
	"fmt"
	"slices"
	"strings"
)

// AWSScope is an entry's "aws" block: the regions and services that requests signed
// again with its aws credential may name in their SigV4 credential scope. Both lists are
// required and lower-case; "*" alone allows any.
type AWSScope struct {
	Regions  []string `json:"regions"`
	Services []string `json:"services"`
	// AllowMinting lets Services name a service that answers with new keys (or "*"):
	// keys egressd signs for, handed to the sandbox whole, which nothing can scrub.
	AllowMinting bool `json:"allow_minting,omitempty"`
}

// mintingServices answer a request signed with the credential's keys with new keys
// (STS session and role keys, IAM access keys, SSO role keys, Cognito identity keys,
// S3 Express sessions, ECR and CodeArtifact tokens) as powerful as the credential
// and usable without egressd, so signing for them would hand the sandbox a secret.
var mintingServices = []string{"*", "codeartifact", "cognito-identity", "ecr", "iam", "s3express", "sso", "sts"}

// AllowsRegion reports whether a request signed for region may be signed again.
func (s *AWSScope) AllowsRegion(region string) bool { return s != nil && allowsName(s.Regions, region) }

// AllowsService reports whether a request signed for service may be signed again.
func (s *AWSScope) AllowsService(service string) bool {
	return s != nil && allowsName(s.Services, service)
}

func allowsName(list []string, name string) bool {
	return slices.Contains(list, "*") || slices.Contains(list, name)
}

// awsScope validates entry i's aws block: every name a lower-case SigV4 scope element.
func (c *compiler) awsScope(i int, credential string, s *AWSScope) *AWSScope {
	if s == nil {
		return nil
	}
	if credential == "" {
		c.problem(i, "aws", `an "aws" block needs a "credential" of type aws on the same entry`)
	}
	out := &AWSScope{}
	out.Regions = c.scopeNames(i, "regions", s.Regions, `e.g. ["us-east-1", "eu-west-1"]`)
	out.Services = c.scopeNames(i, "services", s.Services, `e.g. ["s3", "dynamodb"]`)
	out.AllowMinting = s.AllowMinting
	for _, svc := range out.Services {
		if slices.Contains(mintingServices, svc) && !s.AllowMinting {
			c.problem(i, "aws", `services: %q answers with new keys that the sandbox would then hold, usable without egressd; `+
				`name the services the agent needs instead, or set "allow_minting": true to accept that`, svc)
		}
	}
	return out
}

// scopeNames validates the aws block's list named key; problems are reported at "aws".
func (c *compiler) scopeNames(i int, key string, names []string, example string) []string {
	if len(names) == 0 {
		c.problem(i, "aws", `%q is required: the names requests may be signed for, %s ("*" for any)`, key, example)
		return nil
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		if n == "" || n != strings.ToLower(n) || strings.ContainsAny(n, "/ \t") {
			c.problem(i, "aws", "%s: %q is not a lower-case name as SigV4 writes it, %s", key, n, example)
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// awsScopeMessage is the credential_scope message of a request to an aws entry's host
// that egressd would not sign again (detail from internal/sigv4): what to change. "" for
// other details.
func awsScopeMessage(host, detail string) string {
	const pair = "the placeholder key pair from `egressd sandbox env` (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; AWS_SESSION_TOKEN unset)"
	msg, ok := map[string]string{
		"aws_unsigned": "requests to %s must be signed (SigV4, Authorization header) with " + pair,
		"aws_key":      "the request to %s is signed with an access key that is not this sandbox's placeholder: sign with " + pair + ", not keys from another profile",
		"aws_region":   "the request to %s is signed for a region its allowlist entry does not allow: sign for one of the entry's aws.regions, or ask the operator to add the region",
		"aws_service":  "the request to %s is signed for a service its allowlist entry does not allow: use one of the entry's aws.services, or ask the operator to add the service",
		"aws_no_scope": `the allowlist entry for %s names an aws credential but no "aws": {"regions": [...], "services": [...]} block: the operator must add one`,
		"aws_chunk_signed": "the request to %s uses chunk-signed streaming (STREAMING-AWS4-HMAC-SHA256-PAYLOAD), which egressd cannot sign again: " +
			"have the SDK send a hashed or unsigned payload over HTTPS (botocore/boto3/AWS CLI: s3 payload_signing_enabled = false, request_checksum_calculation = when_required; AWS SDK for Java: chunkedEncodingEnabled(false))",
		"aws_presigned": "the request to %s is a presigned URL made with the placeholder key, which egressd does not sign again: make the call with the SDK (an Authorization header) instead of presigning",
		"aws_payload":   "the request to %s carries no usable X-Amz-Content-Sha256 and a body too large (or of unknown length) to hash: have the SDK send X-Amz-Content-Sha256 (a hex hash, or UNSIGNED-PAYLOAD for S3)",
	}[detail]
	if !ok {
		return ""
	}
	return fmt.Sprintf(msg+"; nothing was sent", host)
}

package allowlist

import (
	"slices"
	"strings"
)

// AWSScope is an entry's "aws" block: the regions and services that requests signed
// again with its aws credential may name in their SigV4 credential scope. Both lists are
// required and lower-case; "*" alone allows any.
type AWSScope struct {
	Regions  []string
	Services []string
}

// Allows reports whether a request signed for region and service may be signed again.
func (s *AWSScope) Allows(region, service string) bool {
	return s != nil && allowsName(s.Regions, region) && allowsName(s.Services, service)
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
	out.Services = c.scopeNames(i, "services", s.Services, `e.g. ["s3", "sts"]`)
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

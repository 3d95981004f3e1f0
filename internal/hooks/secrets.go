package hooks

import (
	"math"
	"strings"
)

// Heuristics for secrets in hooks.json, which lives inside the sandbox: anything there
// the agent can read. They err on the side of an error whose fix ("move it to a
// credential") is always possible.

// secretNames are header names that carry credentials (lower case).
var secretNames = map[string]bool{
	"authorization": true, "proxy-authorization": true, "cookie": true, "x-api-key": true,
}

// secretNameParts mark a header or query parameter name as secret-looking.
var secretNameParts = []string{"token", "secret", "key", "passw", "auth", "session", "credential", "signature"}

// tokenPrefixes are the published prefixes of common API keys and tokens.
var tokenPrefixes = []string{
	"sk-", "sk_live_", "sk_test_", "rk_live_", "pk_live_", // OpenAI, Anthropic, Stripe
	"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", // GitHub
	"glpat-",                                    // GitLab
	"xoxb-", "xoxp-", "xoxa-", "xoxs-", "xapp-", // Slack
	"AKIA", "ASIA", // AWS access key IDs
	"AIza",  // Google API keys
	"ya29.", // Google OAuth access tokens
	"hf_",   // Hugging Face
}

// authSchemes are HTTP authentication schemes followed by a credential.
var authSchemes = []string{"bearer ", "basic ", "token ", "digest ", "apikey "}

// Thresholds of the high-entropy check.
const (
	minRandomLen     = 24  // shorter strings are too often IDs, dates and media types
	minRandomEntropy = 3.5 // bits per character; English words and paths stay below
)

// secretName reports whether a header name looks like it carries a secret.
func secretName(name string) bool {
	n := strings.ToLower(name)
	if secretNames[n] {
		return true
	}
	for _, p := range secretNameParts {
		if strings.Contains(n, p) {
			return true
		}
	}
	return false
}

// tokenShaped says why a value looks like a credential, or "" when it does not.
func tokenShaped(v string) string {
	v = strings.TrimSpace(v)
	lower := strings.ToLower(v)
	for _, s := range authSchemes {
		if strings.HasPrefix(lower, s) && len(v) > len(s) {
			return "an HTTP credential (" + strings.TrimSpace(v[:len(s)]) + " ...)"
		}
	}
	for _, p := range tokenPrefixes {
		if strings.HasPrefix(v, p) && len(v) >= len(p)+8 {
			return "a token (" + p + "...)"
		}
	}
	if strings.HasPrefix(v, "eyJ") && strings.Count(v, ".") == 2 {
		return "a JWT"
	}
	if looksRandom(v) {
		return "a token (a long random string)"
	}
	return ""
}

// looksRandom reports whether v is a long, high-entropy string of token characters
// with both letters and digits.
func looksRandom(v string) bool {
	if len(v) < minRandomLen {
		return false
	}
	var letters, digits bool
	counts := map[rune]int{}
	for _, c := range v {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
			letters = true
		case '0' <= c && c <= '9':
			digits = true
		case strings.ContainsRune("+/=_-.~", c):
		default:
			return false
		}
		counts[c]++
	}
	return letters && digits && entropy(counts, len(v)) >= minRandomEntropy
}

// entropy is the Shannon entropy in bits per character.
func entropy(counts map[rune]int, n int) float64 {
	var h float64
	for _, c := range counts {
		p := float64(c) / float64(n)
		h -= p * math.Log2(p)
	}
	return h
}

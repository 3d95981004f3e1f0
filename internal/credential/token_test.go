package credential

import (
	"errors"
	"strings"
	"testing"
)

// testPEM is a PKCS#8 Ed25519 key (RFC 8410 section 10.3), as egressd's hook signing key is
// stored: {"token": "<PEM>"}.
const testPEM = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n"

func TestTokenOfPEMSecret(t *testing.T) {
	for _, pemText := range []string{testPEM, strings.TrimSuffix(testPEM, "\n"), strings.ReplaceAll(testPEM, "\n", "\r\n")} {
		hs, err := ParseSecret("hook-signing-key", map[string]any{"token": pemText})
		if err != nil {
			t.Fatalf("a PEM token is rejected: %v", err)
		}
		tok, ok := Value{Headers: hs}.Token()
		if !ok || tok != pemText {
			t.Errorf("Token() = %t and %d bytes, want the PEM verbatim (%d bytes)", ok, len(tok), len(pemText))
		}
	}
}

func TestTokenOfOtherShapes(t *testing.T) {
	for _, tc := range []struct {
		raw  map[string]any
		want string
		ok   bool
	}{
		{map[string]any{"token": planted}, planted, true},
		{map[string]any{"headers": map[string]any{"authorization": "Bearer " + planted}}, planted, true},
		{map[string]any{"headers": map[string]any{"X-Api-Key": planted}}, "", false},
		{map[string]any{"headers": map[string]any{"Authorization": "Token " + planted}}, "", false},
		{map[string]any{"username": "u", "password": planted}, "", false},
	} {
		hs, err := ParseSecret("c", tc.raw)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := (Value{Headers: hs}).Token(); got != tc.want || ok != tc.ok {
			t.Errorf("%v: Token() = %t (%d bytes), want %t (%d bytes)", names(hs), ok, len(got), tc.ok, len(tc.want))
		}
	}
}

// Line breaks stay refused everywhere but in one whole PEM block: a header can never be split.
func TestTokenLineBreaksOnlyInPEM(t *testing.T) {
	for name, tok := range map[string]string{
		"plain token with LF":   "abc\ndef",
		"CRLF header injection": planted + "\r\nX-Evil: 1",
		"PEM after junk":        "junk\n" + testPEM,
		"PEM with a trailer":    testPEM + "X-Evil: 1\n",
		"two PEM blocks":        testPEM + testPEM,
		"PEM with NUL":          strings.Replace(testPEM, "MC4C", "MC4C\x00", 1),
		"truncated PEM":         testPEM[:40],
	} {
		_, err := ParseSecret("c", map[string]any{"token": tok})
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: accepted (err %v)", name, err)
		}
		if err != nil && strings.Contains(err.Error(), planted) {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
	}
}

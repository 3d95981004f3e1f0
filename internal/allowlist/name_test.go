package allowlist

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	label63, name253 := strings.Repeat("a", 63), strings.Repeat(strings.Repeat("a", 62)+".", 4)+"a"
	for _, good := range []string{
		"example.com", "a", "a-b.example", "r3---sn-apo3qvuoxuxbt-j5pe.googlevideo.com", "xn--bcher-kva.example",
		"_dmarc.example.com", "a_.example", "_.example", "1.example", label63 + ".com", name253,
	} {
		if err := ValidateName(good); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", good, err)
		}
	}
	for _, bad := range []string{
		"-a.example.com", "a-.example.com", "x.-b.example", "x.b-.example", "-", "a.-", "example.com-",
		label63 + "a.com", name253 + "a", "a..b", ".a", "a.", "a$b.com", "a b.com", "a*b.com", "a!b.com",
		"a\\.b.com", "A.com", "a\x00b.com",
	} {
		err := ValidateName(bad)
		if !errors.Is(err, ErrBadName) || !errors.Is(err, ErrBadHost) {
			t.Errorf("ValidateName(%q) = %v, want an error wrapping ErrBadName and ErrBadHost", bad, err)
		}
	}
}

// TestNormalizeHostBadNames: NormalizeHost applies ValidateName, so a name that
// is not a DNS name fails with ErrBadName; a broken IP literal or URL piece is a
// bad host but not a bad name.
func TestNormalizeHostBadNames(t *testing.T) {
	for _, bad := range []string{"-a.example.com", "A-.Example.Com.", "a..example.com", strings.Repeat("a", 64) + ".com",
		strings.Repeat("a.", 127) + "com", "a$b.com", "xn--zz.example", strings.Repeat("a", maxRawLen+1)} {
		if _, _, err := NormalizeHost(bad); !errors.Is(err, ErrBadName) {
			t.Errorf("NormalizeHost(%q) = %v, want ErrBadName", bad, err)
		}
	}
	for _, notName := range []string{"", "1.2.3.256", "[::1", "a b.com", "user@a.com", "a.com/x", "::1::2"} {
		if _, _, err := NormalizeHost(notName); !errors.Is(err, ErrBadHost) || errors.Is(err, ErrBadName) {
			t.Errorf("NormalizeHost(%q) = %v, want ErrBadHost but not ErrBadName", notName, err)
		}
	}
}

// TestPolicyRefusesBadNames: an allowlist entry whose domain is not a DNS name is
// a config error, through the same ValidateName.
func TestPolicyRefusesBadNames(t *testing.T) {
	for _, d := range []string{"*.-bad.example", "a-.example.com", "*.a..example"} {
		_, err := Compile([]Entry{{Domain: d}}, Options{})
		if err == nil || !strings.Contains(err.Error(), "label") {
			t.Errorf("Compile(%q) = %v, want a problem naming the label", d, err)
		}
	}
}

// nameRef is an independent statement of the rule ValidateName applies.
var nameRef = regexp.MustCompile(`^([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?))*$`)

// FuzzValidateName compares ValidateName with nameRef and checks that
// NormalizeHost accepts as a name exactly what ValidateName accepts of its
// output, and returns a valid name unchanged.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"example.com", "-a.example", "a-.example", "a..b", "_dmarc.x", "r3---sn.x", "a$b", "a.b-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidateName(s)
		if want := nameRef.MatchString(s) && len(s) <= maxNameLen; (err == nil) != want {
			t.Fatalf("ValidateName(%q) = %v, reference says valid=%v", s, err, want)
		}
		if err != nil && !errors.Is(err, ErrBadName) {
			t.Fatalf("ValidateName(%q) = %v: does not wrap ErrBadName", s, err)
		}
		host, addr, nerr := NormalizeHost(s)
		if nerr == nil && !addr.IsValid() && ValidateName(host) != nil {
			t.Fatalf("NormalizeHost(%q) = %q, which ValidateName refuses", s, host)
		}
		if err == nil && !addr.IsValid() && nerr == nil && host != s {
			t.Fatalf("NormalizeHost(%q) = %q: a valid name changed", s, host)
		}
	})
}

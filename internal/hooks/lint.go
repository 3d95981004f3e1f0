package hooks

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/netguard"
)

// Severity of a Finding.
type Severity string

// Severities: an error makes `egressd check` exit 1; a warning does not. Neither stops
// `egressd run`, which enforces what it can and fails the rest closed.
const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
)

// Finding is one lint result, located by its JSON path in hooks.json
// (security-gate.pre_tool_execution[0].hooks[0].url), or, from LintPolicy, by its path
// in the allowlist ([3].credential). Messages never contain a header value.
type Finding struct {
	Path     string   `json:"path"`
	Severity Severity `json:"severity"`
	Msg      string   `json:"message"`
}

// String renders "path: message".
func (f Finding) String() string {
	if f.Path == "" {
		return f.Msg
	}
	return f.Path + ": " + f.Msg
}

// BuiltinTools are the agent runtime's built-in sandbox tools: the only ones hooks run
// for (never MCP or function tools).
var BuiltinTools = []string{
	"code_execution", "view_file", "write_to_file", "replace_file_content", "list_dir",
	"delete_file", "read_file", "write_file", "list_files",
}

// catchAll are the matchers the runtime documents as matching every tool.
var catchAll = []string{"*", "", ".*"}

// LintOptions are what Lint judges hooks.json against.
type LintOptions struct {
	// Policy is the compiled allowlist; hook URLs it refuses are errors. Nil skips
	// the check.
	Policy *allowlist.Policy
	// Guard judges hook URLs that are IP literals as the proxy would (allow_cidrs may
	// open a private range). Nil: every class but public (netguard.Classify) is
	// internal.
	Guard *netguard.Guard
	// FailClosed is hooks.fail_closed: egressd then answers a pre-tool call with a deny
	// before the runtime's timeout, so a missing timeout is only noted.
	FailClosed bool
}

// securityGroup is the heuristic for a group whose purpose is to block: its name says
// so. A post_tool_execution hook in such a group is most likely expected to deny, and
// cannot.
var securityGroup = regexp.MustCompile(`(?i)secur|gate|guard|polic|block|deny|enforc|approv|permi|protect|firewall|safety`)

// longTimeout is the threshold of the long-timeout warning.
const longTimeout = 60 * time.Second

// LintJSON parses hooks.json and lints it; parse problems are error findings.
func LintJSON(data []byte, o LintOptions) []Finding {
	f, err := Parse(data)
	var perr *ParseError
	switch {
	case errors.As(err, &perr):
		return perr.Problems
	case err != nil:
		return []Finding{{Severity: SeverityError, Msg: err.Error()}}
	}
	return Lint(f, o)
}

// Lint judges a parsed hooks.json: secrets in headers or URLs, hook URLs the allowlist
// or the address guard refuse, matchers that are not RE2 or match no built-in tool,
// catch-all matchers (noted: built-in tools only), missing, long or too short timeouts,
// post hooks in groups that look like security gates, URLs shared by pre and post
// hooks, and unknown keys. Findings come in document order, unknown keys last.
func Lint(f *File, o LintOptions) []Finding {
	l := &linter{o: o, pre: map[string]bool{}}
	for _, g := range f.Groups {
		for _, r := range g.Pre {
			for _, h := range r.Hooks {
				if h.Type == TypeHTTP && g.Enabled {
					l.pre[h.Scheme+" "+h.Target.String()+h.PPath] = true
				}
			}
		}
	}
	stray := map[string]bool{} // judged by strayKey
	for _, g := range f.Groups {
		l.group(g)
		for _, st := range g.Stray {
			stray[st.Path] = true
		}
	}
	for _, p := range f.Unknown {
		if !stray[p] {
			l.warnf(p, "unknown key: egressd ignores it (the runtime may not)")
		}
	}
	return l.out
}

type linter struct {
	o   LintOptions
	pre map[string]bool // http pre hook URLs of enabled groups
	out []Finding
}

func (l *linter) errorf(path, format string, args ...any) {
	l.out = append(l.out, Finding{Path: path, Severity: SeverityError, Msg: fmt.Sprintf(format, args...)})
}

func (l *linter) warnf(path, format string, args ...any) {
	l.out = append(l.out, Finding{Path: path, Severity: SeverityWarning, Msg: fmt.Sprintf(format, args...)})
}

func (l *linter) group(g Group) {
	if len(g.Post) > 0 && securityGroup.MatchString(g.Name) {
		l.warnf(keyPath(g.Path, EventPost), "group %q looks like a security gate, but a post_tool_execution hook runs after the tool "+
			"and cannot block it (a deny there is ignored); put the check under pre_tool_execution", g.Name)
	}
	for _, ev := range events {
		for _, r := range g.Rules(ev) {
			l.matcher(r)
			for _, h := range r.Hooks {
				l.hook(g, ev, h)
			}
		}
	}
	for _, st := range g.Stray {
		l.strayKey(st)
	}
}

// groupKeys are the keys a group may have.
var groupKeys = append([]string{"enabled"}, events...)

// strayKey judges an unknown key of a group. A misspelt event is never run, so the
// gate it holds is silently off: a key near an event name, or one that names a tool
// event, is an error. Every hook under it still gets the secret lint.
func (l *linter) strayKey(st StrayKey) {
	switch s := config.Suggest(st.Name, groupKeys); {
	case s != "" && s != "enabled":
		l.errorf(st.Path, "unknown event; did you mean %q? A misspelt event is never run: the hooks under it are off", s)
	case s != "":
		l.errorf(st.Path, "unknown key; did you mean %q?", s)
	case strings.Contains(strings.ToLower(st.Name), "tool"):
		l.errorf(st.Path, "unknown event; the events are %s: the hooks under it are never run", strings.Join(events, " and "))
	default:
		l.warnf(st.Path, "unknown key: egressd ignores it (the runtime may not)")
	}
	for _, r := range st.Rules {
		for _, h := range r.Hooks {
			if h.Type == TypeHTTP {
				l.headers(h)
			}
		}
	}
}

// matcher checks one rule's matcher.
func (l *linter) matcher(r Rule) {
	path := keyPath(r.Path, "matcher")
	if slices.Contains(catchAll, r.Matcher) {
		l.warnf(path, "catch-all matcher %q: it covers the built-in sandbox tools only, never MCP or function tools, "+
			"which no hook sees; guard those at the MCP server and with the allowlist", r.Matcher)
		return
	}
	re, err := regexp.Compile(r.Matcher)
	if err != nil {
		hint := ""
		if strings.HasPrefix(r.Matcher, "*") {
			hint = fmt.Sprintf("; matchers are regular expressions, not globs: did you mean %q?", "."+r.Matcher)
		}
		l.errorf(path, "%q is not a valid RE2 regular expression (%v)%s", r.Matcher, unwrapRegexp(err), hint)
		return
	}
	// The runtime may search or anchor the pattern; a matcher that matches no tool
	// name even unanchored matches nothing either way.
	if !slices.ContainsFunc(BuiltinTools, re.MatchString) {
		l.warnf(path, "%q matches none of the built-in tools (%s); hooks never run for MCP or function tools",
			r.Matcher, strings.Join(BuiltinTools, ", "))
	}
}

// unwrapRegexp returns the code of a regexp syntax error without the pattern echo.
func unwrapRegexp(err error) string {
	var se *syntax.Error
	if errors.As(err, &se) {
		return string(se.Code)
	}
	return err.Error()
}

func (l *linter) hook(g Group, event string, h Hook) {
	l.timeout(event, h)
	if h.Type != TypeHTTP {
		return
	}
	l.headers(h)
	l.url(h)
	if event == EventPost && g.Enabled && l.pre[h.Scheme+" "+h.Target.String()+h.PPath] {
		l.warnf(keyPath(h.Path, "url"), "a pre_tool_execution hook uses the same URL: egressd treats every call to it "+
			"as pre_tool_execution (signed as such, and failures answered with deny)")
	}
}

// timeout checks a hook's timeout for the event. For a pre hook the runtime counts a
// timeout as an approval; egressd closes that gap only for http hooks with fail_closed.
func (l *linter) timeout(event string, h Hook) {
	path := keyPath(h.Path, "timeout")
	guarded := l.o.FailClosed && h.Type == TypeHTTP
	switch {
	case event == EventPre && !h.TimeoutSet && guarded:
		l.warnf(h.Path, "no timeout: the runtime's default %s applies; egressd answers deny at %s, "+
			"before the runtime's timeout (which it would count as an approval)", DefaultTimeout, Deadline(DefaultTimeout))
	case event == EventPre && !h.TimeoutSet:
		l.warnf(h.Path, "no timeout: the runtime's default %s applies, and in the runtime a timeout is an approval%s; "+
			"set a short explicit timeout", DefaultTimeout, unguarded(h))
	case event == EventPre && h.Timeout > longTimeout && guarded:
		l.warnf(path, "%s is long: the tool call waits up to that long (egressd answers deny at %s)", h.Timeout, Deadline(h.Timeout))
	case event == EventPre && h.Timeout > longTimeout:
		l.warnf(path, "%s is long: the tool call waits that long, and in the runtime a timeout is an approval%s",
			h.Timeout, unguarded(h))
	case h.Timeout > longTimeout:
		l.warnf(path, "%s is long: the agent waits up to that long after every matched tool call", h.Timeout)
	case event == EventPre && guarded && h.Timeout < DeadlineMargin+MinDeadline:
		l.warnf(path, "%s is short: egressd answers deny after %s, only %s before the runtime's timeout, "+
			"which the runtime counts as an approval; allow at least %s", h.Timeout, Deadline(h.Timeout),
			h.Timeout-Deadline(h.Timeout), DeadlineMargin+MinDeadline)
	}
}

// unguarded names why egressd does not turn this hook's timeout into a deny.
func unguarded(h Hook) string {
	if h.Type == TypeCommand {
		return " (a command hook runs inside the sandbox: egressd never sees it)"
	}
	return " (hooks.fail_closed is off)"
}

// headers refuses secret-looking headers: hooks.json sits inside the sandbox.
func (l *linter) headers(h Hook) {
	for _, hd := range h.Headers {
		why := ""
		if secretName(hd.Name) {
			why = "its name says it carries a secret"
		} else if shape := tokenShaped(hd.Value); shape != "" {
			why = "its value looks like " + shape
		}
		if why != "" {
			l.errorf(keyPath(keyPath(h.Path, "headers"), hd.Name), "header %s: %s, and hooks.json is readable inside the sandbox; "+
				"move it to a credential on the allowlist entry for %s (egressd injects it on the way out)", hd.Name, why, h.Target.Host)
		}
	}
}

// url checks a hook URL: written in its normal form, no secrets in it, allowed by the
// allowlist, not internal.
func (l *linter) url(h Hook) {
	path := keyPath(h.Path, "url")
	if u, err := url.Parse(h.URL); err == nil {
		if n := normalURL(h, u); n != h.URL {
			l.warnf(path, "the URL's normal form (RFC 3986) is %s: egressd matches calls by it, "+
				"and the runtime's HTTP client may send either spelling; write it that way", n)
		}
		if u.User != nil {
			l.errorf(path, "the URL carries user info (a secret readable inside the sandbox); move it to a credential on the allowlist entry for %s", h.Target.Host)
		}
		for name := range u.Query() {
			if secretName(name) {
				l.errorf(path, "query parameter %s looks like a secret, readable inside the sandbox; move it to a credential header on the allowlist entry for %s", name, h.Target.Host)
			}
		}
	}
	if l.o.Policy != nil {
		if d := l.o.Policy.DecideRequest(h.Target, h.Scheme); !d.Allowed() {
			l.errorf(path, "egressd refuses this URL (%s): %s", d.Reason, policyFix(d, h))
		}
	}
	if h.Target.IsIP() {
		if class := l.internal(h.Target); class != "" {
			l.errorf(path, "%s is an internal address (%s): the address guard refuses it; use the endpoint's public name", h.Target.Host, class)
		}
	}
}

// policyFix says how to make the allowlist accept a hook URL.
func policyFix(d allowlist.Decision, h Hook) string {
	switch d.Reason {
	case allowlist.ReasonNotAllowlisted:
		return fmt.Sprintf(`add {"domain": %q} to network.allowlist`, h.Target.Host)
	case allowlist.ReasonPortNotAllowed:
		return fmt.Sprintf("add port %d to the ports of allowlist entry %q", h.Target.Port, d.RuleName())
	case allowlist.ReasonPlaintextCredential:
		return fmt.Sprintf("the entry %q injects a credential; use an https:// URL", d.RuleName())
	}
	return "fix the URL's host"
}

// internal returns the class that makes an IP literal internal, or "".
func (l *linter) internal(t allowlist.Target) netguard.Class {
	ap := netip.AddrPortFrom(t.Addr, t.Port)
	if l.o.Guard == nil {
		return netguard.Classify(t.Addr)
	}
	var be *netguard.BlockedError
	if errors.As(l.o.Guard.Check(ap), &be) {
		return be.Class
	}
	return ""
}

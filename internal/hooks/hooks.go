// Package hooks recognises the agent runtime's hook calls, signs them, and turns every
// failure of a pre-tool policy call into an explicit deny.
//
// The pieces, in the order a hook call meets them:
//
//   - Parse reads hooks.json into a File (parse.go); Lint judges it for `egressd check`
//     (lint.go).
//   - NewIndex maps the http hooks of enabled groups by URL; Index.Lookup tells the proxy
//     whether a request is hook traffic, and of which group, event and timeout (index.go).
//   - A Signer signs NewClaims with Ed25519 into the Egressd-Hook-Assertion header and
//     serves its public keys as a JWKS (sign.go, key.go). It signs pkg/hookauth's Claims,
//     the type policy endpoints verify, so the two cannot drift.
//   - Deadline, CheckDecision and DenyBody are the fail-closed guard (failclosed.go):
//     egressd answers a pre_tool_execution call with an explicit deny whenever the
//     endpoint's answer is anything but a well-formed allow or deny, because the
//     runtime itself treats every failure as allow.
//
// Invariant: nothing here makes a failed pre-tool call look like an allow; every
// function that judges a decision returns an error unless it saw "allow" or "deny".
package hooks

import (
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/pkg/hookauth"
)

// Events, as hooks.json names them.
const (
	EventPre  = hookauth.EventPreTool  // pre_tool_execution: may deny the tool call
	EventPost = hookauth.EventPostTool // post_tool_execution: observes; cannot block
)

// Types of a hook.
const (
	TypeCommand = "command" // runs inside the sandbox; egressd never sees it
	TypeHTTP    = "http"    // a POST to URL; leaves the sandbox through egressd
)

// DefaultTimeout is the runtime's timeout of a hook that sets none. In the runtime a
// timeout counts as an approval.
const DefaultTimeout = 30 * time.Second

// maxTimeout bounds the timeout key: larger values are surely a unit mistake
// (milliseconds), and stay far from time.Duration's range.
const maxTimeout = 24 * time.Hour

// File is a parsed hooks.json.
type File struct {
	Groups []Group // in document order
	// Unknown are the paths of keys this parser does not know (the runtime's format may
	// grow): kept for Lint, which warns about them; Parse does not fail on them.
	Unknown []string
}

// Group is one named group of hooks.
type Group struct {
	Name    string
	Path    string // JSON path, for findings
	Enabled bool   // "enabled"; default true
	Pre     []Rule // pre_tool_execution
	Post    []Rule // post_tool_execution
	// Stray are the group's unknown keys: a misspelt event is never run, yet its
	// hooks' headers are linted like any others (hooks.json is in the sandbox).
	Stray []StrayKey
}

// StrayKey is an unknown key of a group, with the rules its value holds when it
// reads as an event's list.
type StrayKey struct {
	Name, Path string
	Rules      []Rule
}

// Rule is one entry of an event's list: the hooks to run for tools its Matcher matches.
type Rule struct {
	Path    string
	Matcher string // an RE2 pattern, or the catch-alls "", "*" and ".*"; absent is ""
	Hooks   []Hook // in order
}

// Hook is one hook of a rule.
type Hook struct {
	Path    string
	Type    string // TypeCommand or TypeHTTP
	Command string // TypeCommand
	URL     string // TypeHTTP, as written
	Headers []Header
	// Timeout is the "timeout" key in seconds, or DefaultTimeout when TimeoutSet is false.
	Timeout    time.Duration
	TimeoutSet bool

	// Filled for TypeHTTP by Parse: the URL's scheme (lower case), normalised target and
	// escaped path in its normal form (NormalizePath; "" becomes "/"), which Index
	// compares.
	Scheme string
	Target allowlist.Target
	PPath  string
}

// Header is one entry of a hook's "headers": allowlist.Header, which redacts its value
// in every rendering. The value sits in hooks.json, inside the sandbox; Lint refuses the
// ones that look like secrets, and never prints a value.
type Header = allowlist.Header

// Rules returns the group's rules for event (EventPre or EventPost).
func (g *Group) Rules(event string) []Rule {
	if event == EventPre {
		return g.Pre
	}
	return g.Post
}

// events lists the events in the order egressd treats them: pre first.
var events = []string{EventPre, EventPost}

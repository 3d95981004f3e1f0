// Package configs holds egressd's shipped configs. The quick-start policy and
// credentials are embedded in the binary, so `egressd run` without --config works
// from any directory, not only the repository root.
package configs

import _ "embed"

// Environment is configs/environment.json, the quick-start policy.
//
//go:embed environment.json
var Environment []byte

// Credentials is configs/credentials.json, the quick-start credentials (demo values).
//
//go:embed credentials.json
var Credentials []byte

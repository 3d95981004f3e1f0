package main

import (
	"bytes"
	"os"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/daemon"
)

// lintAdminToken reports an admin.token file run could not read (or an empty one):
// every admin request would then be refused 503, so the mistake shows at check time.
func lintAdminToken(l *daemon.Loaded) []config.Problem {
	f := l.Cfg.Admin.Token.File
	if f == "" {
		return nil
	}
	data, err := os.ReadFile(f)
	switch {
	case err != nil:
		return []config.Problem{{Path: "admin.token.file", Msg: "cannot read the admin token: " + err.Error() +
			"; every admin request would be refused (503)"}}
	case len(bytes.TrimSpace(data)) == 0:
		return []config.Problem{{Path: "admin.token.file", Msg: f + " is empty; every admin request would be refused (503)"}}
	}
	return nil
}

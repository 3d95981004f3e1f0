package supervise

import (
	"os"
	"strconv"
	"strings"
)

// The worker's side of the protocol. Besides the sockets (sockets.EnvWorker), a
// worker inherits a pipe whose descriptor EnvReport names; it writes one byte
// when it serves (reportStarted) and one when it is ready (reportReady: its
// credential backend has answered, as /readyz says). EnvUpgrade asks a worker to
// serve only once ready: the old worker serves everything until then.
const (
	EnvReport  = "EGRESSD_WORKER_REPORT_FD"
	EnvUpgrade = "EGRESSD_WORKER_UPGRADE"

	reportStarted = 's'
	reportReady   = 'r'
)

// oomScoreRaise is what a worker adds to its oom_score_adj (up to the maximum,
// 1000), so that the kernel's OOM killer picks the worker, which holds the
// memory, rather than the parent that holds the sockets. Raising it needs no
// privilege.
const oomScoreRaise = 500

// Reporter is a worker's channel to its parent; its methods do nothing outside a
// worker (a nil Reporter).
type Reporter struct {
	f       *os.File
	Upgrade bool // serve only once ready (EnvUpgrade)
}

// Worker returns the Reporter of this process when its parent is egressd's
// supervisor (nil otherwise), unsets the variables that say so, and makes this
// process the OOM killer's choice over its parent.
func Worker() *Reporter {
	v, ok := os.LookupEnv(EnvReport)
	if !ok {
		return nil
	}
	upgrade := os.Getenv(EnvUpgrade) != ""
	os.Unsetenv(EnvReport)
	os.Unsetenv(EnvUpgrade)
	raiseOOMScore()
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return &Reporter{Upgrade: upgrade}
	}
	return &Reporter{f: os.NewFile(uintptr(fd), "report"), Upgrade: upgrade}
}

// Started reports that the worker serves.
func (r *Reporter) Started() { r.write(reportStarted) }

// Ready reports that the worker is ready; the pipe is closed then.
func (r *Reporter) Ready() {
	r.write(reportReady)
	if r != nil && r.f != nil {
		r.f.Close()
	}
}

func (r *Reporter) write(b byte) {
	if r != nil && r.f != nil {
		r.f.Write([]byte{b})
	}
}

func raiseOOMScore() {
	const path = "/proc/self/oom_score_adj"
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	cur, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	os.WriteFile(path, []byte(strconv.Itoa(min(cur+oomScoreRaise, 1000))), 0)
}

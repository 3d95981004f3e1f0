// Package load holds what the bench and the suites that drive egressd under load share: latency samples and their quantiles, and error messages grouped by kind.
package load

import (
	"regexp"
	"slices"
	"time"
)

// Latencies keeps every latency measured. It takes no lock: each client keeps
// its own and they are merged once the clients are done, so recording stays
// out of the measurement.
type Latencies []time.Duration

// Record adds one latency.
func (l *Latencies) Record(d time.Duration) { *l = append(*l, d) }

// Merge adds every latency of o.
func (l *Latencies) Merge(o Latencies) { *l = append(*l, o...) }

// N is how many latencies were recorded.
func (l Latencies) N() int { return len(l) }

// Quantile is the nearest-rank latency below which a fraction q of the
// samples fall: Quantile(1) is the largest, 0 when there are none. It sorts l
// in place.
func (l Latencies) Quantile(q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return l[min(max(int(q*float64(len(l))+0.5), 1), len(l))-1]
}

// Mean is the average latency, 0 when there are none.
func (l Latencies) Mean() time.Duration {
	var sum time.Duration
	for _, d := range l {
		sum += d
	}
	return sum / time.Duration(max(len(l), 1))
}

// ephemeral matches loopback addresses with a port, which differ on every
// connection and would split one kind of error into thousands of groups.
var ephemeral = regexp.MustCompile(`127\.\d+\.\d+\.\d+:\d+`)

// ErrorKind is msg with its loopback addresses and ports masked, to group
// errors that differ only in the connection they happened on.
func ErrorKind(msg string) string { return ephemeral.ReplaceAllString(msg, "127.x:port") }

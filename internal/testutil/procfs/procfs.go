// Package procfs reads a process's resource figures from /proc, for the bench
// and the soak test: resident memory and open file descriptors.
package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// RSS is the process's current resident set (VmRSS), in bytes.
func RSS(pid int) (int64, error) { return StatusBytes(pid, "VmRSS") }

// PeakRSS is the process's peak resident set (VmHWM), in bytes.
func PeakRSS(pid int) (int64, error) { return StatusBytes(pid, "VmHWM") }

// StatusBytes is a field of /proc/<pid>/status given in kB (VmRSS, VmHWM,
// RssAnon, ...), in bytes.
func StatusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		v, ok := strings.CutPrefix(line, field+":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			break
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		return kb << 10, err
	}
	return 0, fmt.Errorf("no %s in kB in /proc/%d/status", field, pid)
}

// FDs is how many file descriptors the process has open.
func FDs(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}

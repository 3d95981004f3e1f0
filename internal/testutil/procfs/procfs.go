// Package procfs reads a process's resource figures from /proc, for the bench
// and the soak test: resident memory, CPU time, open file descriptors and their limit.
package procfs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LoadAvg is the machine's 1-minute load average, from /proc/loadavg.
func LoadAvg() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("/proc/loadavg is empty")
	}
	return strconv.ParseFloat(f[0], 64)
}

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

// FDLimit is the soft "Max open files" of /proc/<pid>/limits.
func FDLimit(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, err
	}
	return parseFDLimit(string(b))
}

func parseFDLimit(limits string) (uint64, error) {
	for line := range strings.Lines(limits) {
		rest, ok := strings.CutPrefix(line, "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		if f[0] == "unlimited" {
			return 1 << 62, nil
		}
		return strconv.ParseUint(f[0], 10, 64)
	}
	return 0, errors.New("no \"Max open files\" in /proc/pid/limits")
}

// CPU is the CPU time (user + system, all threads) process pid has used,
// from /proc/<pid>/stat. Its resolution is one clock tick (10 ms at the usual
// 100 Hz), which is fine over a run of seconds.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces; the
	// fields after the last ')' start at field 3 (state).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc/pid/stat format")
	}
	f := strings.Fields(string(b[i+1:]))
	const utime, stime = 14 - 3, 15 - 3 // proc(5) field numbers, shifted
	if len(f) <= stime {
		return 0, errors.New("short /proc/pid/stat")
	}
	var ticks uint64
	for _, s := range []string{f[utime], f[stime]} {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/pid/stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / time.Duration(ClockTicks()), nil
}

// ClockTicks is USER_HZ, the unit of /proc/<pid>/stat times. The standard
// library has no sysconf(_SC_CLK_TCK); the kernel passes the same value to every
// process as AT_CLKTCK in the auxiliary vector, so it is read from
// /proc/self/auxv, falling back to 100 (what every Linux architecture Go runs
// on uses).
var ClockTicks = sync.OnceValue(func() int64 {
	const atClkTck, fallback = 17, 100
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return fallback
	}
	word := strconv.IntSize / 8
	for len(b) >= 2*word {
		k, v := readWord(b, word), readWord(b[word:], word)
		b = b[2*word:]
		if k == atClkTck && v > 0 {
			return int64(v)
		}
		if k == 0 { // AT_NULL ends the vector
			break
		}
	}
	return fallback
})

func readWord(b []byte, size int) uint64 {
	if size == 4 {
		return uint64(binary.NativeEndian.Uint32(b))
	}
	return binary.NativeEndian.Uint64(b)
}

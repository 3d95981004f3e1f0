package main

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

	"github.com/egressd/egressd/internal/testutil/procfs"
)

// procCPU is the CPU time (user + system, all threads) process pid has used,
// from /proc/<pid>/stat. Its resolution is one clock tick (10 ms at the usual
// 100 Hz), which is fine over a run of seconds.
func procCPU(pid int) (time.Duration, error) {
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
	return time.Duration(ticks) * time.Second / time.Duration(clockTicks()), nil
}

// procPeakRSS is VmHWM from /proc/<pid>/status, in bytes.
func procPeakRSS(pid int) (int64, error) { return procfs.PeakRSS(pid) }

// procRSS is VmRSS from /proc/<pid>/status (the current resident set, not its
// peak), in bytes.
func procRSS(pid int) (int64, error) { return procfs.RSS(pid) }

// loadAvg is the 1-minute load average, or 0 if /proc/loadavg cannot be read.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times. The standard
// library has no sysconf(_SC_CLK_TCK); the kernel passes the same value to every
// process as AT_CLKTCK in the auxiliary vector, so it is read from
// /proc/self/auxv, falling back to 100 (what every Linux architecture Go runs
// on uses).
var clockTicks = sync.OnceValue(func() int64 {
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

package conformance_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// memoryCgroup is a memory cgroup this suite made below its own, for running
// egressd at a memory limit: the shipped Kubernetes limit, to see that no attack
// gets it OOM-killed.
type memoryCgroup struct {
	dir string
	v2  bool
}

// envRequireCgroup makes a case that needs a writable memory cgroup fail rather
// than skip without one.
const envRequireCgroup = "EGRESSD_REQUIRE_CGROUP"

// newMemoryCgroup makes a memory cgroup of limit bytes (no swap) below this
// process's own (cgroup v2 memory.max, or v1 memory.limit_in_bytes) and removes
// it at the test's end. Without a writable memory controller the test is
// skipped, saying why (failed when EGRESSD_REQUIRE_CGROUP is set).
func newMemoryCgroup(t *testing.T, limit int64) *memoryCgroup {
	t.Helper()
	cg, err := makeMemoryCgroup(fmt.Sprintf("egressd-conformance-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err != nil {
		if os.Getenv(envRequireCgroup) != "" {
			t.Fatalf("no writable memory cgroup (%s is set): %v", envRequireCgroup, err)
		}
		t.Skipf("no writable memory cgroup to run egressd in (the suite needs root and a cgroup v1 memory or v2 hierarchy it may write): %v", err)
	}
	t.Cleanup(cg.remove)
	files := map[bool][]string{false: {"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}, true: {"memory.max", "memory.swap.max"}}[cg.v2]
	if err := cg.write(files[0], strconv.FormatInt(limit, 10)); err != nil {
		t.Fatalf("setting the cgroup's memory limit: %v", err)
	}
	cg.write(files[1], map[bool]string{false: strconv.FormatInt(limit, 10), true: "0"}[cg.v2]) // no swap, where the kernel has it
	return cg
}

// makeMemoryCgroup creates a cgroup named name beside this process's memory
// cgroup's children: under the v1 memory hierarchy when there is one, else the v2
// unified one (which needs the memory controller enabled for its children).
func makeMemoryCgroup(name string) (*memoryCgroup, error) {
	own, err := ownCgroups()
	if err != nil {
		return nil, err
	}
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	if m, ok := mounts["memory"]; ok && own["memory"] != "" {
		dir := filepath.Join(m.point, strings.TrimPrefix(own["memory"], m.root), name)
		return &memoryCgroup{dir: dir}, os.Mkdir(dir, 0o755)
	}
	if m, ok := mounts["cgroup2"]; ok && own[""] != "" {
		parent := filepath.Join(m.point, strings.TrimPrefix(own[""], m.root))
		os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory"), 0) // may already be on
		cg := &memoryCgroup{dir: filepath.Join(parent, name), v2: true}
		if err := os.Mkdir(cg.dir, 0o755); err != nil {
			return nil, err
		}
		if _, err := os.Stat(filepath.Join(cg.dir, "memory.max")); err != nil {
			cg.remove()
			return nil, fmt.Errorf("the memory controller is not enabled below %s", parent)
		}
		return cg, nil
	}
	return nil, errors.New("no cgroup v1 memory hierarchy and no cgroup v2 mount in /proc/self/mountinfo")
}

// ownCgroups maps each v1 controller of /proc/self/cgroup (and "" for the v2
// unified hierarchy) to this process's cgroup path in it.
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	own := map[string]string{}
	for line := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			own[c] = f[2]
		}
	}
	return own, nil
}

type cgroupMount struct{ root, point string }

// cgroupMounts maps "memory" to the v1 memory hierarchy's mount and "cgroup2" to
// the v2 one's, from /proc/self/mountinfo.
func cgroupMounts() (map[string]cgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mounts := map[string]cgroupMount{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, sup := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(sup) < 3 {
			continue
		}
		m := cgroupMount{root: fields[3], point: fields[4]}
		switch {
		case sup[0] == "cgroup2":
			mounts["cgroup2"] = m
		case sup[0] == "cgroup" && hasOption(sup[2], "memory"):
			mounts["memory"] = m
		}
	}
	return mounts, sc.Err()
}

func hasOption(opts, name string) bool {
	for o := range strings.SplitSeq(opts, ",") {
		if o == name {
			return true
		}
	}
	return false
}

func (cg *memoryCgroup) write(name, value string) error {
	return os.WriteFile(filepath.Join(cg.dir, name), []byte(value), 0)
}

// wrap is the egressdtest.Options.Wrap that starts egressd inside the cgroup: the
// shell moves itself there, then execs egressd (which keeps its PID).
func (cg *memoryCgroup) wrap() []string {
	return []string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(cg.dir, "cgroup.procs")}
}

// peak is the cgroup's largest memory use so far (v1 memory.max_usage_in_bytes,
// v2 memory.peak), or -1 when the kernel does not say.
func (cg *memoryCgroup) peak() int64 {
	name := map[bool]string{false: "memory.max_usage_in_bytes", true: "memory.peak"}[cg.v2]
	b, err := os.ReadFile(filepath.Join(cg.dir, name))
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// ooms is how many times the cgroup's limit made the kernel kill a process in it
// (v1 memory.oom_control oom_kill, v2 memory.events oom_kill), or -1 when unknown.
func (cg *memoryCgroup) ooms() int64 {
	name := map[bool]string{false: "memory.oom_control", true: "memory.events"}[cg.v2]
	b, err := os.ReadFile(filepath.Join(cg.dir, name))
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "oom_kill "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

// remove deletes the cgroup once the processes in it have ended (egressd is
// stopped by an earlier cleanup), waiting a bounded time for them.
func (cg *memoryCgroup) remove() {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := os.Remove(cg.dir); err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return
		}
	}
}

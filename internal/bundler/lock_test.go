package bundler

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/testnet"
)

// Two pin paths share a lock only when they are the same directory.
func TestLockNameTellsPathsApart(t *testing.T) {
	same := [][2]string{
		{"/sys/fs/bpf/deptrace", "/sys/fs/bpf//deptrace"},
		{"/sys/fs/bpf/deptrace", "/sys/fs/bpf/deptrace/"},
		{"/sys/fs/bpf/deptrace", "/sys/fs/bpf/./x/../deptrace"},
	}
	for _, p := range same {
		if lockName(p[0]) != lockName(p[1]) {
			t.Errorf("%s and %s are one directory but lock %s and %s", p[0], p[1], lockName(p[0]), lockName(p[1]))
		}
	}
	distinct := []string{"/a/b", "/a_b", "/a-b", "/a\\x2db", "/a/b c", "/a/b.c", "/.a", "/"}
	seen := map[string]string{}
	for _, p := range distinct {
		name := lockName(p)
		if other, ok := seen[name]; ok {
			t.Errorf("%s and %s share the lock %s", p, other, name)
		}
		seen[name] = p
		if filepath.Dir(name) != lockDir || strings.ContainsAny(filepath.Base(name), "/ ") {
			t.Errorf("lock of %s is %q: want one file name in %s without spaces", p, name, lockDir)
		}
	}
	if got, want := lockName("/sys/fs/bpf/deptrace"), filepath.Join(lockDir, "sys-fs-bpf-deptrace.lock"); got != want {
		t.Errorf("lock of the default pin path is %s, want %s (systemd-escape --path)", got, want)
	}
}

// A second agent is refused while the first holds the lock, an agent's
// release removes the lock file, and an agent that opened the file before
// it was removed does not take the lock: it takes the new file's.
func TestLockReleaseRemovesItsFile(t *testing.T) {
	testnet.RequireRoot(t)
	path := fmt.Sprintf("/sys/fs/bpf/deptrace-locktest-%d", os.Getpid())
	first, err := lockAgent(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockAgent(path); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("a second lock while the first is held: %v; want refused naming pid %d", err, os.Getpid())
	}
	stale, err := os.OpenFile(first.name, os.O_RDWR, 0) // as an agent that opened it just before the release
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	first.release()
	if _, err := os.Stat(first.name); !os.IsNotExist(err) {
		t.Fatalf("lock file %s after release: %v; want removed", first.name, err)
	}
	second, err := lockAgent(path)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	defer second.release()
	// The stale file's flock is free now, but it is not the lock.
	if ours, err := flockOpened(stale, first.name); err != nil || ours {
		t.Errorf("flock of the removed lock file: ours %v, err %v; want free and not ours", ours, err)
	}
	if _, err := lockAgent(path); err == nil {
		t.Error("a lock while the second agent holds the new file: want refused")
	}
}

// An agent of the version before lockName locks only the legacy name of
// the default pin path: a new agent (or cleanup) is refused while it
// holds it, and takes it too, so that such an agent is refused while the
// new one runs; other pin paths have no legacy lock (their old names were
// shared).
func TestLockHonoursTheLegacyLock(t *testing.T) {
	testnet.RequireRoot(t)
	path := "/sys/fs/bpf//deptrace" // the default pin path, as typed
	old, err := os.OpenFile(legacyLockName, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := unix.Flock(int(old.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("%s is held: is a deptrace agent running here? %v", legacyLockName, err)
	}
	_ = old.Truncate(0)
	_, _ = old.WriteString("4242\n")
	if l, err := lockAgent(path); err == nil || !strings.Contains(err.Error(), "pid 4242, an earlier version") {
		l.release()
		t.Fatalf("lock while an earlier version holds the legacy lock: %v; want refused naming pid 4242", err)
	}
	if _, err := os.Stat(lockName(path)); !os.IsNotExist(err) {
		t.Errorf("the refused lock left %s: %v", lockName(path), err)
	}
	other, err := lockAgent(fmt.Sprintf("/sys/fs/bpf/deptrace-legacytest-%d", os.Getpid()))
	if err != nil {
		t.Errorf("another pin path while the legacy lock is held: %v; want locked (no legacy lock there)", err)
	}
	other.release()
	_ = unix.Flock(int(old.Fd()), unix.LOCK_UN) // the earlier version stops
	l, err := lockAgent(path)
	if err != nil {
		t.Fatalf("lock after the earlier version stopped: %v", err)
	}
	if err := unix.Flock(int(old.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		t.Error("an earlier version could take the legacy lock while a new agent runs")
	}
	l.release()
	if _, err := os.Stat(legacyLockName); err != nil {
		t.Errorf("the legacy lock file after release: %v; want kept", err)
	}
	if err := unix.Flock(int(old.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("the legacy lock after release: %v; want free", err)
	}
}

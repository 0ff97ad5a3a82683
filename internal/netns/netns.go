// Package netns finds the host's network namespaces and runs code inside
// one of them. Namespaces are identified by the inode number of their nsfs
// file, the number `ls -l /proc/PID/ns/net` and `lsns -t net` show.
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Namespace is one network namespace and a path that opens it.
type Namespace struct {
	Inode uint32
	Path  string // /proc/PID/ns/net or a bind mount such as /var/run/netns/NAME
	Name  string // the `ip netns` name, if any
}

// NamedDir is where `ip netns add` keeps its bind mounts.
const NamedDir = "/var/run/netns"

// Inode returns the namespace inode of an nsfs path.
func Inode(path string) (uint32, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return uint32(st.Ino), nil
}

// Self returns the inode of the caller's network namespace.
func Self() (uint32, error) {
	return Inode("/proc/self/ns/net")
}

// List returns every network namespace reachable from this mount namespace:
// those of running processes and those kept by `ip netns` bind mounts.
func List() ([]Namespace, error) {
	seen := map[uint32]*Namespace{}
	var order []uint32
	add := func(path, name string) {
		ino, err := Inode(path)
		if err != nil {
			return // the process exited or the mount went away
		}
		if ns, ok := seen[ino]; ok {
			if name != "" && ns.Name == "" {
				ns.Name, ns.Path = name, path
			}
			return
		}
		seen[ino] = &Namespace{Inode: ino, Path: path, Name: name}
		order = append(order, ino)
	}
	if self, err := Self(); err == nil {
		seen[self] = &Namespace{Inode: self, Path: "/proc/self/ns/net"}
		order = append(order, self)
	}
	if entries, err := os.ReadDir(NamedDir); err == nil {
		for _, e := range entries {
			add(filepath.Join(NamedDir, e.Name()), e.Name())
		}
	}
	// Bind mounts elsewhere (Docker's /run/docker/netns, a runtime's own
	// directory) keep a namespace with no process in it.
	for _, path := range nsfsMounts() {
		add(path, "")
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		add(filepath.Join("/proc", p.Name(), "ns", "net"), "")
	}
	out := make([]Namespace, 0, len(order))
	for _, ino := range order {
		out = append(out, *seen[ino])
	}
	sort.SliceStable(out[1:], func(i, j int) bool { return out[1+i].Inode < out[1+j].Inode })
	return out, nil
}

// Names maps namespace inodes to their `ip netns` names.
func Names() map[uint32]string {
	names := map[uint32]string{}
	entries, err := os.ReadDir(NamedDir)
	if err != nil {
		return names
	}
	for _, e := range entries {
		if ino, err := Inode(filepath.Join(NamedDir, e.Name())); err == nil {
			names[ino] = e.Name()
		}
	}
	return names
}

// HostName is what the tables call the host's own network namespace.
const HostName = "host"

// DisplayNames is Names plus the host's own namespace as HostName,
// unless `ip netns` names it: what an operator reads in a table column,
// where an inode says nothing. The host's is deptrace's own, as the agent
// takes it (deptrace runs in the host's network namespace).
func DisplayNames() map[uint32]string {
	names := Names()
	if ino, err := Self(); err == nil && names[ino] == "" {
		names[ino] = HostName
	}
	return names
}

// Resolve turns a --netns value into an inode: "all" (0), "self", a
// number, an `ip netns` name, or a path to an nsfs file.
func Resolve(value string) (uint32, error) {
	switch v := strings.TrimSpace(value); {
	case v == "" || v == "all":
		return 0, nil
	case v == "self":
		return Self()
	case strings.HasPrefix(v, "net:["): // as ls -l /proc/PID/ns/net prints it
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(v, "net:["), "]"), 10, 32)
		if err != nil {
			return 0, fmt.Errorf("invalid --netns %q: want net:[N] with N a namespace's inode number", value)
		}
		return existing(value, uint32(n))
	default:
		if n, err := strconv.ParseUint(v, 10, 32); err == nil {
			return existing(value, uint32(n))
		}
		path := v
		if !strings.Contains(v, "/") {
			path = filepath.Join(NamedDir, v)
		}
		ino, err := netInode(path)
		if err != nil {
			return 0, fmt.Errorf("invalid --netns %q: want all, self, an inode number, an ip-netns name or an nsfs path: %w", value, err)
		}
		// The seed and the harvest find it again by inode (List).
		return existing(value, ino)
	}
}

// existing is ino when a network namespace has it; value is what was
// typed, for the error. A number no namespace has is a typo that would
// trace nothing, silently.
func existing(value string, ino uint32) (uint32, error) {
	if !exists(ino) {
		if task := taskIn(ino); task != "" {
			return 0, fmt.Errorf("invalid --netns %q: only a thread is in that namespace (%s), and deptrace enters a namespace through a process or a bind mount: allowed one held by a process, or bind it first (mkdir -p /run/netns && touch /run/netns/NAME && mount --bind %s /run/netns/NAME)", value, task, task)
		}
		return 0, fmt.Errorf("invalid --netns %q: no process of this host is in that namespace and no bind mount here holds it (lsns -t net lists them)", value)
	}
	return ino, nil
}

// netInode is the inode of the network namespace at path, or an error
// when path is no namespace (a plain file, a namespace of another kind).
func netInode(path string) (uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }() // opened to ask its type only
	kind, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err != nil {
		return 0, fmt.Errorf("%s is not a namespace file", path)
	}
	if kind != unix.CLONE_NEWNET {
		return 0, fmt.Errorf("%s is a namespace of another kind, not a network namespace", path)
	}
	return Inode(path)
}

// nsfsMounts lists the mount points of network namespaces bound in this
// mount namespace (/proc/self/mountinfo: fstype nsfs, root net:[N]).
func nsfsMounts() []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var paths []string
	for _, line := range strings.Split(string(data), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 || !strings.HasPrefix(post, "nsfs ") || !strings.HasPrefix(f[3], "net:[") {
			continue
		}
		paths = append(paths, unescapeMountPath(f[4]))
	}
	return paths
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space,
// \011, \012, \134).
func unescapeMountPath(p string) string {
	if !strings.Contains(p, "\\") {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' && i+3 < len(p) {
			if n, err := strconv.ParseUint(p[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// exists reports whether a network namespace with inode ino is reachable
// (List: a process's, or a bind mount's): what the seed, the harvest and
// the source-address lookups enter.
func exists(ino uint32) bool {
	list, err := List()
	if err != nil {
		return true // cannot tell: let tracing start
	}
	for _, ns := range list {
		if ns.Inode == ino {
			return true
		}
	}
	return false
}

// taskIn is the /proc path of a thread in namespace ino, if one is (a
// thread that entered it with setns while its process stayed outside),
// for the error that says why such a namespace is refused.
func taskIn(ino uint32) string {
	tasks, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*/ns/net")
	for _, path := range tasks {
		if got, err := Inode(path); err == nil && got == ino {
			return path
		}
	}
	return ""
}

// Do runs fn with the calling goroutine's thread inside the namespace at
// path. Sockets and BPF iterators created inside fn belong to that
// namespace. The thread is restored before returning; if restoring fails
// the thread is left locked so the Go runtime retires it.
func Do(path string, fn func() error) error {
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer func() { _ = target.Close() }() // a namespace handle, read-only

	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open current netns: %w", err)
	}
	defer func() { _ = orig.Close() }() // a namespace handle, read-only

	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		if errors.Is(err, unix.EINVAL) {
			// The bind mount was just removed (ip netns del): what is left
			// at the path is a plain file, no namespace.
			return fmt.Errorf("enter netns %s: no network namespace there any more: %w", path, os.ErrNotExist)
		}
		return fmt.Errorf("enter netns %s: %w", path, err)
	}
	fnErr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Keep the thread locked: it must never run other goroutines.
		return errors.Join(fnErr, fmt.Errorf("return from netns %s: %w", path, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

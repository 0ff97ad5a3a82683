package identity

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cgroupTree maps cgroup ids to cgroup v2 paths. On cgroup v2 a cgroup's id
// (what bpf_get_current_cgroup_id returns) is the inode number of its
// directory. Directories are learnt at start by a walk and then as they
// are made, through inotify on every directory of the tree, so a cgroup
// that existed for a few milliseconds (a one-request container) keeps its
// path after it is removed, for retain.
type cgroupTree struct {
	root   string
	retain time.Duration

	mu       sync.Mutex
	byID     map[uint64]*treeEntry
	byPath   map[string]uint64
	byWatch  map[int]string // inotify watch descriptor -> path
	lastScan time.Time
	noWatch  bool // the inotify watch limit was reached: rely on walks

	file *os.File // inotify, nil without it
	done chan struct{}

	// onNew, if set, is told of each cgroup made while watching (outside
	// the lock), so what runs in it can be named while it exists.
	onNew   func(id uint64, path string)
	pending []treeNew // made in this batch of events, for onNew
	notify  bool      // addLocked records into pending
}

type treeNew struct {
	id   uint64
	path string
}

type treeEntry struct {
	path string    // relative to the cgroup2 mount, with a leading "/"
	gone time.Time // when its directory was removed; zero while it exists
}

// rescanEvery bounds walks of the tree on a lookup miss.
const rescanEvery = 2 * time.Second

func newCgroupTree(root string, retain time.Duration, onNew func(id uint64, path string)) (*cgroupTree, error) {
	t := &cgroupTree{root: filepath.Clean(root), retain: retain, byID: map[uint64]*treeEntry{},
		byPath: map[string]uint64{}, byWatch: map[int]string{}, done: make(chan struct{}), onNew: onNew}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		// Without inotify, walks on misses still find live cgroups.
		close(t.done)
	} else {
		t.file = os.NewFile(uintptr(fd), "inotify")
		go t.watch()
	}
	t.mu.Lock()
	err = t.scanLocked(t.root)
	t.mu.Unlock()
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("walk cgroup tree %s: %w", root, err)
	}
	return t, nil
}

// Close stops watching.
func (t *cgroupTree) Close() {
	if t.file != nil {
		_ = t.file.Close() // stops the watch; Close has no error to return
		<-t.done
	}
}

func (t *cgroupTree) rel(abs string) string {
	r := abs[len(t.root):]
	if r == "" {
		return "/"
	}
	return r
}

// scanLocked walks dir and below, recording every cgroup and watching it.
func (t *cgroupTree) scanLocked(dir string) error {
	if dir == t.root {
		t.lastScan = time.Now()
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			return nil // removed while walking
		}
		if !d.IsDir() {
			return nil
		}
		t.addLocked(p)
		return nil
	})
}

func (t *cgroupTree) addLocked(abs string) {
	var st unix.Stat_t
	if err := unix.Stat(abs, &st); err != nil {
		return
	}
	rel := t.rel(abs)
	if old, ok := t.byPath[rel]; ok && old != st.Ino {
		delete(t.byID, old) // a new cgroup of the same name
	}
	t.byID[st.Ino] = &treeEntry{path: rel}
	t.byPath[rel] = st.Ino
	if t.notify {
		t.pending = append(t.pending, treeNew{st.Ino, rel})
	}
	if t.file != nil && !t.noWatch {
		wd, err := unix.InotifyAddWatch(int(t.file.Fd()), abs, unix.IN_CREATE|unix.IN_DELETE|unix.IN_ONLYDIR)
		switch {
		case errors.Is(err, syscall.ENOSPC):
			t.noWatch = true
		case err == nil:
			t.byWatch[wd] = abs
		}
	}
}

func (t *cgroupTree) removedLocked(abs string, when time.Time) {
	rel := t.rel(abs)
	if id, ok := t.byPath[rel]; ok {
		if e := t.byID[id]; e != nil && e.gone.IsZero() {
			e.gone = when
		}
		delete(t.byPath, rel)
	}
}

func (t *cgroupTree) watch() {
	defer close(t.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := t.file.Read(buf)
		if err != nil {
			return // closed
		}
		now := time.Now()
		t.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			name := string(nameBytes)
			for i := 0; i < len(name); i++ {
				if name[i] == 0 {
					name = name[:i]
					break
				}
			}
			if ev.Mask&unix.IN_IGNORED != 0 {
				delete(t.byWatch, int(ev.Wd))
				continue
			}
			parent, ok := t.byWatch[int(ev.Wd)]
			if !ok || name == "" || ev.Mask&unix.IN_ISDIR == 0 {
				continue
			}
			abs := parent + "/" + name
			switch {
			case ev.Mask&unix.IN_CREATE != 0:
				// Subdirectories made before the watch was added are
				// found by walking the new directory.
				t.notify = t.onNew != nil
				_ = t.scanLocked(abs)
				t.notify = false
			case ev.Mask&unix.IN_DELETE != 0:
				t.removedLocked(abs, now)
			}
		}
		made := t.pending
		t.pending = nil
		t.mu.Unlock()
		for _, n := range made {
			t.onNew(n.id, n.path)
		}
	}
}

// Path returns the cgroup v2 path of a cgroup id: a live cgroup's, or one
// removed less than retain ago that the tree saw. A miss walks the tree
// again (at most every rescanEvery) for cgroups the watches missed.
func (t *cgroupTree) Path(id uint64) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byID[id]; ok {
		return e.path, true
	}
	if time.Since(t.lastScan) < rescanEvery {
		return "", false
	}
	_ = t.scanLocked(t.root)
	if e, ok := t.byID[id]; ok {
		return e.path, true
	}
	return "", false
}

// prune forgets cgroups removed more than retain ago.
func (t *cgroupTree) prune(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, e := range t.byID {
		if !e.gone.IsZero() && now.Sub(e.gone) > t.retain {
			delete(t.byID, id)
		}
	}
}

// runtimes says which runtimes have containers in the tree now.
func (t *cgroupTree) runtimes() map[string]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]bool{}
	for _, e := range t.byID {
		if p := ParsePath(e.path); p.ContainerID != "" {
			out[p.Runtime] = true
		}
	}
	return out
}

// learn records the cgroup at a path relative to the mount (a container's,
// read from its main process at start), in case no watch saw it made.
func (t *cgroupTree) learn(rel string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byPath[rel]; ok {
		return
	}
	t.addLocked(filepath.Join(t.root, rel))
}

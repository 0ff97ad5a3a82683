package identity

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// The tree knows every directory by inode: those there at start, those
// made later (nested ones too, made before a watch could be added), and
// removed ones until retain has passed. Any directory tree behaves as the
// cgroup tree does here, so this runs without root.
func TestCgroupTreeLearnsAndRetains(t *testing.T) {
	root := t.TempDir()
	old := filepath.Join(root, "system.slice", "old.service")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	made := make(chan string, 16)
	tree, err := newCgroupTree(root, time.Minute, func(_ uint64, p string) { made <- p })
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Close()
	if p, ok := tree.Path(inode(t, old)); !ok || p != "/system.slice/old.service" {
		t.Fatalf("existing dir: %q, %v", p, ok)
	}
	if p, ok := tree.Path(inode(t, root)); !ok || p != "/" {
		t.Fatalf("root: %q, %v", p, ok)
	}
	nested := filepath.Join(root, "docker", "abc", "inner")
	if err := os.MkdirAll(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	ids := map[string]uint64{}
	for _, p := range []string{"/docker", "/docker/abc", "/docker/abc/inner"} {
		ids[p] = inode(t, filepath.Join(root, p))
	}
	want := map[string]bool{"/docker": true, "/docker/abc": true, "/docker/abc/inner": true}
	for len(want) > 0 {
		select {
		case p := <-made:
			delete(want, p)
		case <-time.After(5 * time.Second):
			t.Fatalf("not told of %v", want)
		}
	}
	// Gone before anyone asked: still known, by the inotify record alone
	// (no walk could find it now).
	if err := os.Remove(nested); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the watch goroutine sees the removal
	tree.mu.Lock()
	tree.lastScan = time.Now()
	tree.mu.Unlock()
	if p, ok := tree.Path(ids["/docker/abc/inner"]); !ok || p != "/docker/abc/inner" {
		t.Fatalf("removed dir: %q, %v", p, ok)
	}
	tree.prune(time.Now().Add(2 * time.Minute))
	if p, ok := tree.Path(ids["/docker/abc/inner"]); ok {
		t.Fatalf("removed dir still known after retain: %q", p)
	}
	if _, ok := tree.Path(ids["/docker/abc"]); !ok {
		t.Fatal("a live dir was pruned")
	}
}

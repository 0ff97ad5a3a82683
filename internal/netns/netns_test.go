package netns

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	if ino, err := Resolve("all"); err != nil || ino != 0 {
		t.Errorf("all: %d %v", ino, err)
	}
	if ino, err := Resolve(""); err != nil || ino != 0 {
		t.Errorf("empty: %d %v", ino, err)
	}
	self, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if ino, err := Resolve("self"); err != nil || ino != self {
		t.Errorf("self: %d %v, want %d", ino, err, self)
	}
	selfNum := strconv.FormatUint(uint64(self), 10)
	if ino, err := Resolve(selfNum); err != nil || ino != self {
		t.Errorf("number: %d %v, want %d", ino, err, self)
	}
	if ino, err := Resolve("net:[" + selfNum + "]"); err != nil || ino != self {
		t.Errorf("ls form: %d %v, want %d", ino, err, self)
	}
	if ino, err := Resolve("/proc/self/ns/net"); err != nil || ino != self {
		t.Errorf("path: %d %v", ino, err)
	}
	_, err = Resolve("no-such-namespace-xyz")
	if err == nil || !strings.Contains(err.Error(), "want all, self") {
		t.Errorf("unknown name: %v", err)
	}
	// An inode no namespace has (1 is the root directory's of most file
	// systems, never an nsfs inode), a plain file, and a namespace of
	// another kind would each trace nothing: refused.
	if _, err := Resolve("1"); err == nil || !strings.Contains(err.Error(), "no process of this host is in that namespace and no bind mount here holds it") {
		t.Errorf("unknown inode: %v", err)
	}
	// The error quotes what was typed, not the number inside it.
	if _, err := Resolve("net:[1]"); err == nil || !strings.Contains(err.Error(), `invalid --netns "net:[1]": no process of this host`) {
		t.Errorf("unknown inode, ls form: %v", err)
	}
	if _, err := Resolve("net:[x]"); err == nil || !strings.Contains(err.Error(), `invalid --netns "net:[x]": want net:[N]`) {
		t.Errorf("ls form without a number: %v", err)
	}
	plain := filepath.Join(t.TempDir(), "notans")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve(plain); err == nil || !strings.Contains(err.Error(), "is not a namespace file") {
		t.Errorf("plain file: %v", err)
	}
	if _, err := Resolve("/proc/self/ns/mnt"); err == nil || !strings.Contains(err.Error(), "not a network namespace") {
		t.Errorf("mount namespace: %v", err)
	}
}

func TestListIncludesSelfFirst(t *testing.T) {
	list, err := List()
	if err != nil {
		t.Fatal(err)
	}
	self, _ := Self()
	if len(list) == 0 || list[0].Inode != self {
		t.Fatalf("list %+v should start with self %d", list, self)
	}
	seen := map[uint32]bool{}
	for _, ns := range list {
		if seen[ns.Inode] {
			t.Errorf("namespace %d listed twice", ns.Inode)
		}
		seen[ns.Inode] = true
	}
}

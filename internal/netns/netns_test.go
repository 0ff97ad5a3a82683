package netns

import (
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
	if ino, err := Resolve("4026531840"); err != nil || ino != 4026531840 {
		t.Errorf("number: %d %v", ino, err)
	}
	if ino, err := Resolve("net:[4026531841]"); err != nil || ino != 4026531841 {
		t.Errorf("ls form: %d %v", ino, err)
	}
	if ino, err := Resolve("/proc/self/ns/net"); err != nil || ino != self {
		t.Errorf("path: %d %v", ino, err)
	}
	_, err = Resolve("no-such-namespace-xyz")
	if err == nil || !strings.Contains(err.Error(), "want all, self") {
		t.Errorf("unknown name: %v", err)
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

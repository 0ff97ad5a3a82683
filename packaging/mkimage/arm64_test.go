package main

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/dockertest"

	"github.com/deptrace/deptrace/internal/testnet"
)

// make package GOARCH=arm64 cross-compiles a static aarch64 executable and
// packages it as an arm64 .deb and tarball; mkimage takes it for arm64 and
// refuses it for amd64.
func TestArm64BinaryAndPackage(t *testing.T) {
	if testing.Short() && !testnet.UnderCI() { // never under CI
		t.Skip("cross-compiles deptrace (about a minute on 2 cores)")
	}
	for _, tool := range []struct{ prog, pkg string }{{"make", "make"}, {"dpkg-deb", "dpkg"}, {"tar", "tar"}} {
		dockertest.Need(t, tool.prog, tool.pkg) // a failure under CI=true, never a skip
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "linux_arm64", "deptrace")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	mk := exec.CommandContext(ctx, "make", "-C", "../..", "package", "GOARCH=arm64", "BIN="+bin, "DIST="+dir, "VERSION=1.2.3~test")
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make package GOARCH=arm64: %v\n%s", err, out)
	}

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if f.Machine != elf.EM_AARCH64 || f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Type != elf.ET_EXEC {
		t.Errorf("binary: machine %s, class %s, data %s, type %s; want EM_AARCH64 ELFCLASS64 ELFDATA2LSB ET_EXEC", f.Machine, f.Class, f.Data, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has %s: not static", p.Type)
		}
	}

	deb := filepath.Join(dir, "deptrace_1.2.3~test_arm64.deb")
	out, err := exec.Command("dpkg-deb", "--field", deb, "Architecture", "Package", "Version").Output()
	if err != nil {
		t.Fatalf("dpkg-deb --field %s: %v", deb, err)
	}
	if got := strings.TrimSpace(string(out)); got != "Architecture: arm64\nPackage: deptrace\nVersion: 1.2.3~test" {
		t.Errorf("control of %s:\n%s", deb, got)
	}
	x := filepath.Join(dir, "x")
	if out, err := exec.Command("dpkg-deb", "-x", deb, x).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v\n%s", err, out)
	}
	packaged, _ := os.ReadFile(filepath.Join(x, "usr/bin/deptrace"))
	built, _ := os.ReadFile(bin)
	if len(built) == 0 || string(packaged) != string(built) {
		t.Error("the .deb's /usr/bin/deptrace is not the arm64 binary built")
	}
	tarball := filepath.Join(dir, "deptrace_1.2.3~test_linux_arm64.tar.gz")
	list, err := exec.Command("tar", "-tzf", tarball).Output()
	if err != nil || !strings.Contains(string(list), "deptrace_1.2.3~test_linux_arm64/usr/bin/deptrace\n") {
		t.Errorf("tarball %s: %v\n%s", tarball, err, list)
	}

	if _, err := readBinary(bin, "arm64"); err != nil {
		t.Errorf("readBinary(arm64): %v", err)
	}
	if _, err := readBinary(bin, "amd64"); err == nil || !strings.Contains(err.Error(), "GOARCH=amd64") {
		t.Errorf("readBinary of an arm64 binary for amd64: %v", err)
	}
}

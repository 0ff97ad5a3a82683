package bundler

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/internal/testnet"
)

// Cleanup removes deptrace's pins and nothing else: a directory off bpffs
// (a --pin-path given by mistake) is refused with its files intact; a
// bpffs directory without deptrace's meta pin is refused with its pins
// intact; and a pinned side's own pins go while another tool's pin in the
// same directory stays, with the directory, and the error says so.
func TestCleanupRemovesOnlyDeptracePins(t *testing.T) {
	testnet.RequireRoot(t)
	plain := t.TempDir()
	file := filepath.Join(plain, "important.txt")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if found, err := Cleanup(plain); err == nil || found || !strings.Contains(err.Error(), "not on bpffs") {
		t.Errorf("cleanup of a plain directory: found %v, err %v; want refused as not on bpffs", found, err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("cleanup of a plain directory removed its file: %v", err)
	}

	foreign, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	pinFor := func(dir, name string) string {
		t.Helper()
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := foreign.Pin(p); err != nil {
			t.Fatal(err)
		}
		return p
	}

	other := filepath.Join("/sys/fs/bpf", fmt.Sprintf("deptrace-bundler-test-%d-other", os.Getpid()))
	t.Cleanup(func() { _ = os.RemoveAll(other) })
	otherPin := pinFor(other, "another_tools_map")
	if found, err := Cleanup(other); err == nil || found || !strings.Contains(err.Error(), "no deptrace kernel side") {
		t.Errorf("cleanup of another tool's bpffs directory: found %v, err %v; want refused", found, err)
	}
	if _, err := os.Stat(otherPin); err != nil {
		t.Fatalf("cleanup removed another tool's pin: %v", err)
	}

	// deptrace's names without its meta pin (a removal cut short): removed.
	partial := filepath.Join("/sys/fs/bpf", fmt.Sprintf("deptrace-bundler-test-%d-partial", os.Getpid()))
	t.Cleanup(func() { _ = os.RemoveAll(partial) })
	pinFor(partial, "map_flows_a")
	if found, err := Cleanup(partial); !found || err != nil {
		t.Errorf("cleanup of deptrace's pins without meta: found %v, err %v; want removed", found, err)
	}
	if _, err := os.Stat(partial); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there: %v", partial, err)
	}

	c := pinnedTestConfig(t)
	b, err := Load(c)
	if err != nil {
		t.Fatal(err)
	}
	b.Release() // as a killed agent leaves it: pinned, counting
	mixed := pinFor(c.PinPath, "another_tool")
	t.Cleanup(func() { _ = os.Remove(mixed) })
	found, err := Cleanup(c.PinPath)
	if !found || err == nil || !strings.Contains(err.Error(), "another_tool") {
		t.Errorf("cleanup of a side beside another tool's pin: found %v, err %v; want found, and an error naming another_tool", found, err)
	}
	entries, readErr := os.ReadDir(c.PinPath)
	if readErr != nil || len(entries) != 1 || entries[0].Name() != "another_tool" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("left in %s: %v (%v); want only another_tool", c.PinPath, names, readErr)
	}
	if err := os.Remove(mixed); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if found, err := Cleanup(c.PinPath); found || err != nil {
		t.Errorf("cleanup of the empty directory left: found %v, err %v; want nothing found, no error", found, err)
	}
	if _, err := os.Stat(c.PinPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after the last cleanup: %v", c.PinPath, err)
	}
}

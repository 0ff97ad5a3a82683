package identity

import (
	"reflect"
	"strings"
	"testing"
)

// doctor's cgroup line: units and containers counted once each, by
// runtime, with the drivers their paths show.
func TestReadLayout(t *testing.T) {
	root := t.TempDir()
	id := func(c byte) string { return strings.Repeat(string(c), 64) }
	for _, rel := range []string{
		"system.slice/nginx.service",
		"system.slice/nginx.service/worker", // the same unit
		"user.slice/user-1000.slice/session-3.scope",
		"system.slice/docker-" + id('a') + ".scope",
		"system.slice/docker-" + id('a') + ".scope/init", // the same container
		"docker/" + id('b'),
		"kubepods/besteffort/pod0b8f1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4/" + id('c'),
		"machine.slice/libpod-" + id('d') + ".scope",
	} {
		cgroupDir(t, root, rel)
	}
	l, err := ReadLayout(root)
	if err != nil {
		t.Fatal(err)
	}
	if l.Root != root || l.Cgroups != 17 || l.Units != 2 {
		t.Errorf("root %s, %d cgroups, %d units; want %s, 17, 2", l.Root, l.Cgroups, l.Units, root)
	}
	if want := map[string]int{RuntimeDocker: 2, runtimeCRI: 1, RuntimePodman: 1}; !reflect.DeepEqual(l.Containers, want) {
		t.Errorf("containers %v, want %v", l.Containers, want)
	}
	if want := map[string][]string{RuntimeDocker: {"cgroupfs", "systemd"}, runtimeCRI: {"cgroupfs"}, RuntimePodman: {"systemd"}}; !reflect.DeepEqual(l.Drivers, want) {
		t.Errorf("drivers %v, want %v", l.Drivers, want)
	}
}

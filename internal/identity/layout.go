package identity

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/deptrace/deptrace/internal/kernel"
)

// Layout is what a cgroup v2 tree holds, read as the resolver reads it:
// what doctor shows of the names deptrace can give.
type Layout struct {
	// Root is the cgroup2 mount.
	Root string
	// Hybrid: cgroup v1 hierarchies are mounted beside it (systemd's
	// hybrid mode), where a container is in the v2 tree only if its
	// runtime put it there.
	Hybrid bool
	// Cgroups counts the tree's directories; Units the systemd services
	// and scopes outside containers.
	Cgroups, Units int
	// Containers counts distinct containers by runtime (runtimeCRI,
	// "cri": Kubernetes' cgroupfs layout, either CRI runtime).
	Containers map[string]int
	// Drivers names, per runtime, the cgroup drivers whose paths were
	// found, sorted: "cgroupfs", "systemd" (<runtime>-<id>.scope).
	Drivers map[string][]string
}

// ReadLayout walks the cgroup v2 tree at root ("" finds it in mountinfo).
func ReadLayout(root string) (Layout, error) {
	if root == "" {
		var err error
		if root, err = kernel.CgroupV2Root(); err != nil {
			return Layout{}, err
		}
	}
	root = filepath.Clean(root)
	l := Layout{Root: root, Hybrid: cgroupV1Mounted(), Containers: map[string]int{}, Drivers: map[string][]string{}}
	seen := map[string]bool{}
	units := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil // removed while walking
		}
		if !d.IsDir() {
			return nil
		}
		l.Cgroups++
		rel := strings.TrimPrefix(p, root)
		parsed := ParsePath(rel)
		switch {
		case parsed.ContainerID != "":
			driver := "cgroupfs"
			if strings.Contains(rel, parsed.ContainerID+".scope") {
				driver = "systemd"
			}
			if !slices.Contains(l.Drivers[parsed.Runtime], driver) {
				l.Drivers[parsed.Runtime] = append(l.Drivers[parsed.Runtime], driver)
				slices.Sort(l.Drivers[parsed.Runtime])
			}
			if key := parsed.Runtime + "/" + parsed.ContainerID; !seen[key] {
				seen[key] = true
				l.Containers[parsed.Runtime]++
			}
		case parsed.Unit != "":
			units[parsed.Unit] = true
		}
		return nil
	})
	if err != nil {
		return l, fmt.Errorf("walk cgroup tree %s: %w", root, err)
	}
	l.Units = len(units)
	return l, nil
}

// cgroupV1Mounted says whether a cgroup v1 hierarchy is mounted.
func cgroupV1Mounted() bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }() // read-only
	s := bufio.NewScanner(f)
	for s.Scan() {
		// ... mountpoint opts ... - fstype source superopts
		if _, after, ok := strings.Cut(s.Text(), " - "); ok && strings.HasPrefix(after, "cgroup ") {
			return true
		}
	}
	return false
}

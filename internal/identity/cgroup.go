// Package identity names the local end of a flow the way operators do: the
// systemd unit, the container (Docker, containerd, CRI-O, podman) and the
// Kubernetes pod and workload it runs in. It works from the node alone: the
// flow's cgroup id gives the cgroup v2 directory, its path gives the unit or
// the runtime and container id, and the runtime's own API (Docker's Engine
// API, the CRI gRPC API of containerd and CRI-O) gives names, images and
// labels. No Kubernetes API server is needed.
//
// Lookups happen per new cgroup id, never per event, and are cached; cgroup
// directories and Docker containers are learnt as they appear (inotify on
// the cgroup tree, Docker's event stream), so a container that lived for
// one request is still named after its cgroup is gone.
package identity

import (
	"bufio"
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Runtime names as they appear in tracer.Identity.ContainerRuntime.
const (
	RuntimeDocker     = "docker"
	RuntimeContainerd = "containerd"
	RuntimeCRIO       = "cri-o"
	RuntimePodman     = "podman"
	// runtimeCRI is a Kubernetes container under the cgroupfs driver,
	// whose path does not say which CRI runtime made it.
	runtimeCRI = "cri"
)

// Path is what a cgroup v2 path alone says about the processes in it.
type Path struct {
	// Unit is the innermost systemd service or scope for a process
	// outside containers.
	Unit string
	// Runtime and ContainerID name a container ("" outside containers).
	// Runtime is "cri" for a Kubernetes container under the cgroupfs
	// driver: containerd or CRI-O, the path does not say which.
	Runtime     string
	ContainerID string
	// PodUID is the Kubernetes pod's uid where the path carries it.
	PodUID string
}

var (
	hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// A systemd scope of a container: docker-<id>.scope,
	// cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope.
	// CRI-O under the cgroupfs driver names it crio-<id>, without .scope.
	scopeRe = regexp.MustCompile(`^(docker|cri-containerd|crio|libpod)-([0-9a-f]{64})(?:\.scope)?$`)
	// kubepods-besteffort-pod<uid with _>.slice or kubepods-pod<uid>.slice
	// (systemd driver), pod<uid> (cgroupfs driver).
	podSliceRe = regexp.MustCompile(`^kubepods(?:-[a-z]+)?-pod([0-9a-f_]{36})\.slice$`)
	podDirRe   = regexp.MustCompile(`^pod([0-9a-f-]{36})$`)
)

var scopeRuntime = map[string]string{
	"docker":         RuntimeDocker,
	"cri-containerd": RuntimeContainerd,
	"crio":           RuntimeCRIO,
	"libpod":         RuntimePodman,
}

// ParsePath reads a cgroup v2 path (as in /proc/PID/cgroup's "0::" line,
// relative to the cgroup2 mount): the container it belongs to, for the
// layouts of Docker, containerd under Kubernetes, CRI-O and podman with the
// systemd or the cgroupfs driver, or else the systemd unit.
func ParsePath(p string) Path {
	var out Path
	parts := strings.Split(strings.Trim(p, "/"), "/")
	inKubepods := false
	for i, part := range parts {
		switch {
		case part == "kubepods" || strings.HasPrefix(part, "kubepods.") || strings.HasPrefix(part, "kubepods-"):
			inKubepods = true
			if m := podSliceRe.FindStringSubmatch(part); m != nil {
				out.PodUID = strings.ReplaceAll(m[1], "_", "-")
			}
		case inKubepods && podDirRe.MatchString(part):
			out.PodUID = podDirRe.FindStringSubmatch(part)[1]
		}
		if m := scopeRe.FindStringSubmatch(part); m != nil {
			out.Runtime, out.ContainerID = scopeRuntime[m[1]], m[2]
			continue
		}
		if hex64.MatchString(part) && i > 0 {
			switch parent := parts[i-1]; {
			case parent == "docker":
				out.Runtime, out.ContainerID = RuntimeDocker, part
			case parent == "libpod_parent" || strings.HasPrefix(parent, "libpod"):
				out.Runtime, out.ContainerID = RuntimePodman, part
			case parent == "k8s.io" || parent == "moby":
				// containerd's own cgroupfs layout, /<namespace>/<id>:
				// "moby" is Docker's namespace in containerd.
				rt := RuntimeContainerd
				if parent == "moby" {
					rt = RuntimeDocker
				}
				out.Runtime, out.ContainerID = rt, part
			case inKubepods:
				out.Runtime, out.ContainerID = runtimeCRI, part
			}
		}
	}
	if out.ContainerID != "" {
		return out
	}
	// A process outside containers: the innermost systemd unit that holds
	// processes (services and scopes; slices only group them).
	for i := len(parts) - 1; i >= 0; i-- {
		if strings.HasSuffix(parts[i], ".service") || strings.HasSuffix(parts[i], ".scope") {
			out.Unit = parts[i]
			break
		}
	}
	return out
}

// ProcCgroupV2 returns the cgroup v2 path in the contents of a
// /proc/PID/cgroup file: the "0::" line, alone on a unified host and
// beside the v1 controllers' lines on a hybrid one.
func ProcCgroupV2(content []byte) (string, bool) {
	s := bufio.NewScanner(bytes.NewReader(content))
	for s.Scan() {
		if p, ok := strings.CutPrefix(s.Text(), "0::"); ok {
			return p, true
		}
	}
	return "", false
}

// PIDCgroupV2 reads the cgroup v2 path of a process.
func PIDCgroupV2(pid int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", false
	}
	return ProcCgroupV2(b)
}

package identity

import (
	"testing"
)

const (
	cid  = "3f2b8c1d9e0a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
	cid2 = "9c0e6f4a1b2d3c4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6071829304a5b6"
)

// Real-shaped cgroup v2 paths of every runtime and driver, as they appear
// in /proc/PID/cgroup's "0::" line.
func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want Path
	}{
		// Docker, systemd driver and cgroupfs driver (this machine's).
		{"/system.slice/docker-" + cid + ".scope", Path{Runtime: RuntimeDocker, ContainerID: cid}},
		{"/docker/" + cid, Path{Runtime: RuntimeDocker, ContainerID: cid}},
		// Docker in Docker / a cgroup namespace-less nested daemon.
		{"/docker/" + cid + "/docker/" + cid2, Path{Runtime: RuntimeDocker, ContainerID: cid2}},
		// containerd under Kubernetes, systemd driver, each QoS class.
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f6b1c52_7e36_4a8e_9b1f_3c2d1e0f9a8b.slice/cri-containerd-" + cid + ".scope",
			Path{Runtime: RuntimeContainerd, ContainerID: cid, PodUID: "0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b"}},
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f6b1c52_7e36_4a8e_9b1f_3c2d1e0f9a8b.slice/cri-containerd-" + cid + ".scope",
			Path{Runtime: RuntimeContainerd, ContainerID: cid, PodUID: "0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b"}},
		{"/kubepods.slice/kubepods-pod0f6b1c52_7e36_4a8e_9b1f_3c2d1e0f9a8b.slice/cri-containerd-" + cid + ".scope",
			Path{Runtime: RuntimeContainerd, ContainerID: cid, PodUID: "0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b"}},
		// Kubernetes, cgroupfs driver: the runtime is not in the path.
		{"/kubepods/burstable/pod0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b/" + cid,
			Path{Runtime: runtimeCRI, ContainerID: cid, PodUID: "0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b"}},
		{"/kubepods/pod0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b/" + cid,
			Path{Runtime: runtimeCRI, ContainerID: cid, PodUID: "0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b"}},
		// CRI-O, systemd and cgroupfs drivers; its monitor is no container.
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f6b1c52_7e36_4a8e_9b1f_3c2d1e0f9a8b.slice/crio-" + cid + ".scope",
			Path{Runtime: RuntimeCRIO, ContainerID: cid, PodUID: "0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b"}},
		{"/kubepods/besteffort/pod0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b/crio-" + cid,
			Path{Runtime: RuntimeCRIO, ContainerID: cid, PodUID: "0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b"}},
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f6b1c52_7e36_4a8e_9b1f_3c2d1e0f9a8b.slice/crio-conmon-" + cid + ".scope",
			Path{Unit: "crio-conmon-" + cid + ".scope", PodUID: "0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b"}},
		// containerd without Kubernetes (ctr, nerdctl): /<namespace>/<id>.
		{"/k8s.io/" + cid, Path{Runtime: RuntimeContainerd, ContainerID: cid}},
		{"/moby/" + cid, Path{Runtime: RuntimeDocker, ContainerID: cid}},
		// podman, rootful and rootless, systemd and cgroupfs drivers.
		{"/machine.slice/libpod-" + cid + ".scope", Path{Runtime: RuntimePodman, ContainerID: cid}},
		{"/machine.slice/libpod-" + cid + ".scope/container", Path{Runtime: RuntimePodman, ContainerID: cid}},
		{"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + cid + ".scope", Path{Runtime: RuntimePodman, ContainerID: cid}},
		{"/libpod_parent/" + cid, Path{Runtime: RuntimePodman, ContainerID: cid}},
		// systemd units outside containers.
		{"/system.slice/nginx.service", Path{Unit: "nginx.service"}},
		{"/system.slice/docker.service", Path{Unit: "docker.service"}},
		{"/system.slice/containerd.service/kubepods-burstable-x.slice:cri-containerd:" + cid, Path{Unit: "containerd.service"}},
		{"/user.slice/user-1000.slice/session-3.scope", Path{Unit: "session-3.scope"}},
		{"/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-2231.scope", Path{Unit: "app-gnome-firefox-2231.scope"}},
		{"/system.slice/postgresql@15-main.service", Path{Unit: "postgresql@15-main.service"}},
		// Plain host processes.
		{"/", Path{}},
		{"", Path{}},
		{"/user.slice", Path{}},
		{"/init.scope", Path{Unit: "init.scope"}},
		// Look-alikes that are no container.
		{"/docker", Path{}},
		{"/" + cid, Path{}},
		{"/system.slice/docker-" + cid[:12] + ".scope", Path{Unit: "docker-" + cid[:12] + ".scope"}},
	} {
		if got := ParsePath(tc.path); got != tc.want {
			t.Errorf("ParsePath(%q)\n got %+v\nwant %+v", tc.path, got, tc.want)
		}
	}
}

// The cgroup v2 path is the "0::" line, alone on a unified host and beside
// the v1 controllers on a hybrid one (as on this project's machines).
func TestProcCgroupV2(t *testing.T) {
	hybrid := "12:pids:/docker/" + cid + "\n11:memory:/docker/" + cid + "\n1:name=systemd:/docker/" + cid + "\n0::/docker/" + cid + "\n"
	for _, tc := range []struct {
		content, want string
		ok            bool
	}{
		{hybrid, "/docker/" + cid, true},
		{"0::/system.slice/nginx.service\n", "/system.slice/nginx.service", true},
		{"0::/\n", "/", true},
		{"4:memory:/x\n1:cpu:/\n", "", false}, // v1 only
	} {
		got, ok := ProcCgroupV2([]byte(tc.content))
		if got != tc.want || ok != tc.ok {
			t.Errorf("ProcCgroupV2(%q) = %q, %v; want %q, %v", tc.content, got, ok, tc.want, tc.ok)
		}
	}
}

// The workload comes from the labels a pod's controller sets; no API
// server is asked.
func TestK8sWorkload(t *testing.T) {
	for _, tc := range []struct {
		pod    string
		labels map[string]string
		want   string
	}{
		{"checkout-7d4b9c6f5-x2x4k", map[string]string{"app": "checkout", "pod-template-hash": "7d4b9c6f5"}, "Deployment/checkout"},
		{"web-api-5c9f8d7b6-abcde", map[string]string{"pod-template-hash": "5c9f8d7b6"}, "Deployment/web-api"},
		{"db-0", map[string]string{"controller-revision-hash": "db-6d8f9", "statefulset.kubernetes.io/pod-name": "db-0"}, "StatefulSet/db"},
		{"redis-cluster-12", map[string]string{"controller-revision-hash": "x", "statefulset.kubernetes.io/pod-name": "redis-cluster-12"}, "StatefulSet/redis-cluster"},
		{"node-exporter-7xk2p", map[string]string{"controller-revision-hash": "6f7d8", "pod-template-generation": "3"}, "DaemonSet/node-exporter"},
		{"backup-28901234-q7w8e", map[string]string{"job-name": "backup-28901234", "controller-uid": "u"}, "Job/backup-28901234"},
		{"migrate-xyz12", map[string]string{"batch.kubernetes.io/job-name": "migrate"}, "Job/migrate"},
		{"debug", nil, "Pod/debug"},
		{"", map[string]string{"pod-template-hash": "x"}, ""},
	} {
		if got := k8sWorkload(tc.pod, tc.labels); got != tc.want {
			t.Errorf("k8sWorkload(%q, %v) = %q; want %q", tc.pod, tc.labels, got, tc.want)
		}
	}
}

func TestComposeWorkload(t *testing.T) {
	if got := composeWorkload(map[string]string{"com.docker.compose.project": "shop", "com.docker.compose.service": "web"}); got != "compose/shop/web" {
		t.Errorf("compose labels: got %q", got)
	}
	if got := composeWorkload(map[string]string{"com.docker.compose.project": "shop"}); got != "" {
		t.Errorf("project without service: got %q", got)
	}
}

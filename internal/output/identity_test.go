package output

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// The PROCESS column puts the container, pod or unit before the process,
// and a host process stays "comm/pid".
func TestProcessColumnNamesTheEnd(t *testing.T) {
	const id = "3f2b8c1d9e0a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
	for _, tc := range []struct {
		id   tracer.Identity
		pid  uint32
		want string
	}{
		{tracer.Identity{}, 880, "php-fpm/880"},
		{tracer.Identity{}, 0, "-"},
		{tracer.Identity{Unit: "nginx.service"}, 880, "nginx.service(php-fpm)/880"},
		{tracer.Identity{ContainerID: id, ContainerName: "web", ContainerRuntime: "docker", Workload: "compose/shop/web"}, 880, "web(php-fpm)/880"},
		{tracer.Identity{ContainerID: id, ContainerRuntime: "containerd"}, 880, "3f2b8c1d9e0a(php-fpm)/880"},
		{tracer.Identity{ContainerID: id, ContainerName: "app", PodName: "checkout-7d4b9-x2x4k", PodNamespace: "shop", K8sContainer: "app"}, 880, "checkout-7d4b9-x2x4k:app(php-fpm)/880"},
		{tracer.Identity{ContainerName: "web"}, 0, "web"},
	} {
		f := flow(tracer.Outbound, "tcp", "10.0.1.9", "10.0.1.10", 3306)
		f.PID, f.Identity = tc.pid, tc.id
		if got := TableRow(f, nil)[5]; got != tc.want {
			t.Errorf("%+v pid %d: PROCESS %q, want %q", tc.id, tc.pid, got, tc.want)
		}
	}
}

// Identity fields are in jsonl where known, under issue 18's names, and
// absent (never "") for a plain host process.
func TestJSONLIdentityFields(t *testing.T) {
	host := flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 5432)
	ctr := flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 6379)
	ctr.Identity = tracer.Identity{ContainerID: "abc", ContainerName: "web", ContainerImage: "shop/web:1", ContainerRuntime: "docker",
		PodNamespace: "shop", PodName: "web-0", PodUID: "u-1", K8sContainer: "web", Workload: "StatefulSet/web"}
	unit := flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 8080)
	unit.Identity = tracer.Identity{Unit: "x.service"}
	var buf bytes.Buffer
	w, _ := New("jsonl", &buf, nil, time.Second)
	if err := w.Write([]tracer.Flow{host, ctr, unit}, nil); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	keys := func(line string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	fields := []string{"unit", "container_id", "container_name", "container_image", "container_runtime", "pod_namespace", "pod_name", "pod_uid", "k8s_container", "workload"}
	for _, k := range fields {
		if _, ok := keys(lines[0])[k]; ok {
			t.Errorf("host flow carries %q: %s", k, lines[0])
		}
	}
	m := keys(lines[1])
	want := map[string]string{"container_id": "abc", "container_name": "web", "container_image": "shop/web:1", "container_runtime": "docker",
		"pod_namespace": "shop", "pod_name": "web-0", "pod_uid": "u-1", "k8s_container": "web", "workload": "StatefulSet/web"}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %q: %s", k, m[k], v, lines[1])
		}
	}
	var got []string
	for k := range keys(lines[2]) {
		if slices.Contains(fields, k) {
			got = append(got, k)
		}
	}
	if !slices.Equal(got, []string{"unit"}) || !strings.Contains(lines[2], `"cgroup_id":0,"unit":"x.service",`) {
		t.Errorf("unit flow: %s", lines[2])
	}
}

package kubernetes

import (
	"bytes"
	"errors"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The parts of a DaemonSet the test reads.
type daemonSet struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name, Namespace string
	}
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		}
		Template struct {
			Metadata struct {
				Labels map[string]string
			}
			Spec struct {
				HostPID     bool   `yaml:"hostPID"`
				HostNetwork bool   `yaml:"hostNetwork"`
				DNSPolicy   string `yaml:"dnsPolicy"`
				Tolerations []struct {
					Operator string
					Key      string
				}
				Containers []struct {
					Name  string
					Image string
					Args  []string
					Env   []struct {
						Name  string
						Value string
					}
					Ports []struct {
						Name          string
						ContainerPort int `yaml:"containerPort"`
						HostPort      int `yaml:"hostPort"`
					}
					Resources struct {
						Requests map[string]string
						Limits   map[string]string
					}
					SecurityContext struct {
						Privileged   *bool `yaml:"privileged"`
						Capabilities struct {
							Add  []string
							Drop []string
						}
					} `yaml:"securityContext"`
					VolumeMounts []struct {
						Name      string
						MountPath string `yaml:"mountPath"`
						ReadOnly  bool   `yaml:"readOnly"`
					} `yaml:"volumeMounts"`
				}
				Volumes []struct {
					Name     string
					HostPath *struct {
						Path string
						Type string
					} `yaml:"hostPath"`
					EmptyDir any `yaml:"emptyDir"`
				}
			}
		}
	}
}

func documents(t *testing.T) []map[string]any {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(DaemonSet))
	var docs []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("daemonset.yaml: %v", err)
		}
		docs = append(docs, d)
	}
}

func theDaemonSet(t *testing.T) daemonSet {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(DaemonSet))
	for {
		var ds daemonSet
		if err := dec.Decode(&ds); err != nil {
			t.Fatalf("no DaemonSet in daemonset.yaml: %v", err)
		}
		if ds.Kind == "DaemonSet" {
			return ds
		}
	}
}

// unitCaps reads the capabilities the systemd unit grants: the container
// must hold the same set.
func unitCaps(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../deptrace.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^AmbientCapabilities=(.*)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no AmbientCapabilities in deptrace.service")
	}
	var caps []string
	for _, c := range strings.Fields(string(m[1])) {
		caps = append(caps, strings.TrimPrefix(c, "CAP_"))
	}
	slices.Sort(caps)
	return caps
}

func TestManifestParses(t *testing.T) {
	docs := documents(t)
	var kinds []string
	for _, d := range docs {
		kinds = append(kinds, d["apiVersion"].(string)+"/"+d["kind"].(string))
	}
	if !slices.Equal(kinds, []string{"v1/Namespace", "apps/v1/DaemonSet"}) {
		t.Errorf("documents: %v", kinds)
	}
}

// What docs/operations.md promises of the DaemonSet.
func TestDaemonSetAsDocumented(t *testing.T) {
	ds := theDaemonSet(t)
	spec := ds.Spec.Template.Spec
	if ds.APIVersion != "apps/v1" || ds.Metadata.Namespace != "deptrace" {
		t.Errorf("DaemonSet %s in %q", ds.APIVersion, ds.Metadata.Namespace)
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template's labels", k, v)
		}
	}
	if !spec.HostPID || !spec.HostNetwork || spec.DNSPolicy != "ClusterFirstWithHostNet" {
		t.Errorf("hostPID %v, hostNetwork %v, dnsPolicy %q", spec.HostPID, spec.HostNetwork, spec.DNSPolicy)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != "Exists" || spec.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v: want one tolerating every taint", spec.Tolerations)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	if !slices.Equal(c.Args, []string{"agent"}) {
		t.Errorf("args %v", c.Args)
	}
	caps := slices.Clone(c.SecurityContext.Capabilities.Add)
	slices.Sort(caps)
	if want := unitCaps(t); !slices.Equal(caps, want) {
		t.Errorf("capabilities %v, the systemd unit grants %v", caps, want)
	}
	if !slices.Equal(c.SecurityContext.Capabilities.Drop, []string{"ALL"}) || c.SecurityContext.Privileged == nil || *c.SecurityContext.Privileged {
		t.Errorf("securityContext: drop %v, privileged %v", c.SecurityContext.Capabilities.Drop, c.SecurityContext.Privileged)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != 9477 || c.Ports[0].HostPort != 9477 {
		t.Errorf("ports %+v", c.Ports)
	}
	for _, k := range []string{"cpu", "memory"} {
		if c.Resources.Requests[k] == "" || c.Resources.Limits[k] == "" {
			t.Errorf("resources: no %s request and limit: %+v", k, c.Resources)
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for name, want := range map[string]string{
		"DEPTRACE_METRICS_LISTEN":    "$(NODE_IP):9477",
		"DEPTRACE_CONTAINERD_SOCKET": "/host/run/containerd/containerd.sock",
		"DEPTRACE_CRIO_SOCKET":       "/host/run/crio/crio.sock",
		"DEPTRACE_DOCKER_SOCKET":     "/host/run/docker.sock",
	} {
		if env[name] != want {
			t.Errorf("env %s=%q, want %q", name, env[name], want)
		}
	}
	if _, ok := env["DEPTRACE_HOST_ID"]; !ok {
		t.Error("no DEPTRACE_HOST_ID")
	}

	// Each documented mount: the container path, read-only or not, and
	// the node's path behind it.
	volumes := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			volumes[v.Name] = v.HostPath.Path
		} else if v.EmptyDir != nil {
			volumes[v.Name] = "emptyDir"
		}
	}
	type mount struct {
		hostPath string
		readOnly bool
	}
	got := map[string]mount{}
	for _, m := range c.VolumeMounts {
		hp, ok := volumes[m.Name]
		if !ok {
			t.Errorf("mount %s: no volume %q", m.MountPath, m.Name)
		}
		got[m.MountPath] = mount{hp, m.ReadOnly}
	}
	want := map[string]mount{
		"/sys/fs/bpf":       {"/sys/fs/bpf", false},
		"/sys/kernel/btf":   {"/sys/kernel/btf", true},
		"/sys/fs/cgroup":    {"/sys/fs/cgroup", true},
		"/host/run":         {"/run", true},
		"/run/deptrace":     {"/run/deptrace", false},
		"/var/lib/deptrace": {"/var/lib/deptrace", false},
		"/tmp":              {"emptyDir", false},
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("mount %s: %+v, want %+v", p, got[p], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("mounts %v, want %v", got, want)
	}
}

package graph

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

var checkout = tracer.Identity{ContainerID: "4f1c0ffee0000000000000000000000000000000000000000000000000000001", ContainerName: "app",
	ContainerImage: "registry.local/checkout:1.4", ContainerRuntime: "containerd", PodNamespace: "shop",
	PodName: "checkout-7d4b9c-x2x4k", PodUID: "0e6b1c2d", K8sContainer: "app", Workload: "Deployment/checkout"}

// named is chain() with identities: web's nginx a systemd unit, app a
// Kubernetes pod's container (and, earlier in the range, another
// container of the same command), postgres a plain process.
func named() (Graph, []store.EndIdentity) {
	g := Build(chain(), hosts, nil)
	old := checkout
	old.PodName, old.ContainerID = "checkout-7d4b9c-old00", "0ld"
	Name(&g, []store.EndIdentity{
		{HostID: "web", Comm: "nginx", Identity: tracer.Identity{Unit: "nginx.service"}, LastSeen: at},
		{HostID: "app", Comm: "app", Identity: old, LastSeen: at.Add(-time.Hour)},
		{HostID: "app", Comm: "app", Identity: checkout, LastSeen: at},
	})
	return g, nil
}

func TestNodesAreNamedByTheirIdentity(t *testing.T) {
	g, _ := named()
	if n := node(t, g, ServiceID("app", "tcp", 8080)); n.Identity != checkout {
		t.Errorf("app's service: %+v, want the latest pod %+v", n.Identity, checkout)
	}
	if n := node(t, g, ProcessID("app", "app")); n.Identity != checkout {
		t.Errorf("app's process: %+v", n.Identity)
	}
	if n := node(t, g, ProcessID("web", "nginx")); n.Unit != "nginx.service" || n.ContainerID != "" {
		t.Errorf("nginx: %+v", n.Identity)
	}
	for _, n := range g.Nodes {
		if (n.Process == "postgres" || n.Process == "curl" || n.Kind == KindExternal) && !n.Identity.Empty() {
			t.Errorf("%s has an identity: %+v", n.ID, n.Identity)
		}
	}
	// JSON: the fields of docs/flows.md, only where set; the existing
	// fields unchanged.
	var buf bytes.Buffer
	if err := Write(&buf, g, "json"); err != nil {
		t.Fatal(err)
	}
	var doc struct{ Nodes []map[string]any }
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, n := range doc.Nodes {
		for _, k := range []string{"id", "kind", "host", "addr", "port", "proto", "process", "unhealthy"} {
			if _, ok := n[k]; !ok {
				t.Errorf("%v: field %q missing", n["id"], k)
			}
		}
		switch n["id"] {
		case ServiceID("app", "tcp", 8080):
			if n["workload"] != "Deployment/checkout" || n["pod_name"] != checkout.PodName || n["container_id"] != checkout.ContainerID || n["k8s_container"] != "app" {
				t.Errorf("app's service in JSON: %v", n)
			}
		case ProcessID("db", "postgres"):
			for _, k := range []string{"unit", "container_id", "container_name", "workload", "pod_name"} {
				if _, ok := n[k]; ok {
					t.Errorf("postgres has %q in JSON: %v", k, n)
				}
			}
		}
	}
	// DOT and Mermaid labels name the workload and pod with the process.
	for _, f := range []string{"dot", "mermaid"} {
		buf.Reset()
		if err := Write(&buf, g, f); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"app [Deployment/checkout checkout-7d4b9c-x2x4k:app] on app", "nginx [nginx.service] on web", "postgres on db"} {
			if !strings.Contains(buf.String(), want) {
				t.Errorf("%s lacks %q:\n%s", f, want, buf.String())
			}
		}
	}
}

// look finds an end by what operators call it.
func TestResolveByIdentity(t *testing.T) {
	g, _ := named()
	for target, want := range map[string]string{
		"checkout":                   ProcessID("app", "app"),
		"Deployment/checkout":        ProcessID("app", "app"),
		"checkout-7d4b9c-x2x4k":      ProcessID("app", "app"),
		"shop/checkout-7d4b9c-x2x4k": ProcessID("app", "app"),
		checkout.ContainerID[:12]:    ProcessID("app", "app"),
		"nginx.service":              ProcessID("web", "nginx"),
		"nginx":                      ProcessID("web", "nginx"),
	} {
		got, err := Resolve(g, hosts, target)
		if err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("%s: %v %v; want %s", target, got, err, want)
		}
	}
	trees := Look(g, []string{ProcessID("app", "app")}, 1, true, true, 0)
	var buf bytes.Buffer
	WriteTrees(&buf, trees, true, true)
	if !strings.Contains(buf.String(), "app [Deployment/checkout checkout-7d4b9c-x2x4k:app] on app") || !strings.Contains(buf.String(), "nginx [nginx.service] on web") {
		t.Errorf("look:\n%s", buf.String())
	}
}

// An address learnt from a short-lived namespace's own flow (the store
// keeps it with the host) joins that client to the server's inbound end;
// an address two hosts held goes to the one that held it last.
func TestShortLivedClientJoinsByItsFlowAddress(t *testing.T) {
	obs := []store.Observation{
		o("job", "outbound", "198.51.100.9", "198.51.100.2", 80, "wget", 1, 10, 100),
		o("web", "inbound", "198.51.100.2", "198.51.100.9", 80, "nginx", 1, 100, 10),
	}
	hs := append([]store.Host{}, hosts...)
	g := Build(obs, hs, nil)
	if len(g.Edges) != 2 {
		t.Fatalf("without the job's address: %d edges, want 2 (one from an external): %+v", len(g.Edges), g.Edges)
	}
	hs = append(hs, store.Host{ID: "gone", Addrs: []string{"198.51.100.9"}, AddrsSeen: []time.Time{at.Add(-time.Hour)}},
		store.Host{ID: "job", Addrs: []string{"198.51.100.9"}, AddrsSeen: []time.Time{at}},
		store.Host{ID: "later-sorted", Addrs: []string{"198.51.100.9"}, AddrsSeen: []time.Time{at.Add(-2 * time.Hour)}})
	g = Build(obs, hs, nil)
	if len(g.Edges) != 1 {
		t.Fatalf("with it: %d edges, want 1: %+v", len(g.Edges), g.Edges)
	}
	e := edge(t, g, ProcessID("job", "wget"), ServiceID("web", "tcp", 80))
	if e.Connections != 1 || e.BytesSent != 10 {
		t.Errorf("joined edge: %+v", e)
	}
}

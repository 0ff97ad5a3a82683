package web

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deptrace/deptrace/internal/browsertest"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

var checkoutPod = tracer.Identity{ContainerID: "4f1c0ffee0000000000000000000000000000000000000000000000000000001", ContainerName: "k8s_app_checkout",
	ContainerImage: "registry.local/checkout:1.4", ContainerRuntime: "containerd", PodNamespace: "shop",
	PodName: "checkout-7d4b9c-x2x4k", PodUID: "0e6b1c2d", K8sContainer: "app", Workload: "Deployment/checkout"}

// Node ids by workload (the default grouping) once seedNamed names them.
const (
	idCheckout     = "workload:web-1/Deployment/checkout"
	idPostgresUnit = "workload:db-1/unit:postgresql.service"
)

// seedNamed is seed's store with identities written after it: nginx on
// web-1 runs in the checkout pod, postgres on db-1 in its systemd unit.
func seedNamed(t testing.TB) (string, time.Time) {
	t.Helper()
	path, now := seed(t)
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := now.Add(-10 * time.Minute)
	o := func(host, dir, local, remote, comm string, id tracer.Identity) store.Observation {
		return store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: host, Direction: dir, Proto: "tcp", LocalAddr: local, RemoteAddr: remote,
			Port: 5432, Comm: comm, Identity: id, Counters: tracer.Counters{Connections: 1}, FirstSeen: at, LastSeen: at.Add(time.Second)}
	}
	if err := s.Write(context.Background(), store.Batch{Observations: []store.Observation{
		o("web-1", "outbound", "198.51.100.1", "198.51.100.2", "nginx", checkoutPod),
		o("db-1", "inbound", "198.51.100.2", "198.51.100.1", "postgres", tracer.Identity{Unit: "postgresql.service"}),
	}}); err != nil {
		t.Fatal(err)
	}
	return path, now
}

// The API's nodes carry the identity fields; look and target find an
// end by its workload, pod, container or unit.
func TestAPINamesEnds(t *testing.T) {
	path, _ := seedNamed(t)
	srv, _ := serve(t, path, Options{})
	// By process, every process keeps its id and its identity.
	g := getGraph(t, srv.URL, "/api/graph?group_by=process")
	for _, n := range g.Nodes {
		switch n.ID {
		case idNginx:
			if n.Identity != checkoutPod {
				t.Errorf("nginx: %+v", n.Identity)
			}
		case idPostgres:
			if n.Unit != "postgresql.service" || n.ContainerID != "" {
				t.Errorf("postgres: %+v", n.Identity)
			}
		default:
			if !n.Identity.Empty() {
				t.Errorf("%s named: %+v", n.ID, n.Identity)
			}
		}
	}
	// Fields absent where unset, in the raw JSON.
	_, body, _ := get(t, srv.URL, "/api/graph?group_by=process")
	var raw struct{ Nodes []map[string]any }
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	for _, n := range raw.Nodes {
		if _, ok := n["workload"]; ok != (n["id"] == idNginx) {
			t.Errorf("workload field on %v: %v", n["id"], ok)
		}
	}
	// By workload (the default), nodes are named by their workload, pod,
	// container or service.
	g = getGraph(t, srv.URL, "/api/graph")
	equal(t, "workload nodes", nodeIDs(g), []string{idCheckout, idPostgresUnit, idPython, idRedis, idDNS})
	for _, target := range []string{"checkout", "Deployment/checkout", "shop/checkout-7d4b9c-x2x4k", "postgresql"} {
		code, body, _ := get(t, srv.URL, "/api/look?target="+target)
		if code != http.StatusOK {
			t.Errorf("look %s: %d %s", target, code, body)
			continue
		}
		var ans lookAnswer
		if err := json.Unmarshal(body, &ans); err != nil || len(ans.Trees) != 1 {
			t.Errorf("look %s: %v %s", target, err, body)
		}
	}
	if got := getGraph(t, srv.URL, "/api/graph?target=checkout&depth=1"); len(got.Edges) == 0 {
		t.Errorf("graph around checkout: %+v", got)
	}
}

// The page labels a node by its workload and lists its identity in the
// details; searching the workload's name finds it.
func TestBrowserShowsIdentity(t *testing.T) {
	path, _ := seedNamed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#search"), "checkout")); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.matches === '1'`, `document.querySelector('#map').dataset.matches`)
	want := "Deployment/checkout (nginx) on web-1"
	if got := browsertest.JS[string](t, ctx, `document.querySelector('#matches').innerText`); !strings.Contains(got, want) {
		t.Errorf("matches %q, want %q", got, want)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#matches button"))); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.focus === '`+idCheckout+`'`, `document.querySelector('#map').dataset.focus`)
	browsertest.Until(t, ctx, `document.querySelector('#details').innerText.includes('workload')`, `document.querySelector('#details').innerText`)
	details := browsertest.JS[string](t, ctx, `document.querySelector('#details').innerText`)
	for _, w := range []string{"Deployment/checkout", "shop/checkout-7d4b9c-x2x4k", "registry.local/checkout:1.4", "containerd", "4f1c0ffee000"} {
		if !strings.Contains(details, w) {
			t.Errorf("details lack %q:\n%s", w, details)
		}
	}
	if strings.Contains(details, checkoutPod.ContainerID) {
		t.Errorf("details show the whole container id:\n%s", details)
	}
	deps := browsertest.JS[string](t, ctx, `document.querySelector('#deps').innerText`)
	if !strings.Contains(deps, "postgresql.service (postgres) on db-1") {
		t.Errorf("dependencies of nginx: %q", deps)
	}
	screenshot(t, ctx, "identity")
}

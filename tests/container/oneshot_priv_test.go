package container_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	dtagent "github.com/deptrace/deptrace/internal/agent"
	"github.com/deptrace/deptrace/internal/dockertest"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// A `docker run --rm` client that makes one request to a server container
// and is gone, container, cgroup and network namespace, before deptrace
// drains: it is named in that interval's records (its container name,
// image and id), and through the agent and the store its edge is joined
// at the server's service (its address is learnt from its own flow), not
// left as an external client; `deptrace look` finds it by its name.
func TestDockerOneShotClientJoined(t *testing.T) {
	testnet.RequireRoot(t)
	bin := buildBinary(t)
	d := dockertest.Start(t)
	d.ImportBusybox(t, busybox)
	d.Must(t, "network", "create", "--driver", "bridge", "--subnet", dnsSubnet, "--gateway", dnsGateway,
		"-o", "com.docker.network.bridge.name=dtone"+fmt.Sprint(os.Getpid()%100000), "dtonenet")

	// One drain each, at SIGTERM, after the client is gone.
	store := filepath.Join(t.TempDir(), "deptrace.db")
	sockets := []string{"--docker-socket", d.Socket, "--podman-socket", "", "--containerd-socket", "", "--crio-socket", ""}
	trace := startHost(t, bin, "msg=tracing", append([]string{"trace", "--output", "jsonl", "--proto", "tcp", "--port", port, "--interval", "1h"}, sockets...)...)
	agent := startHost(t, bin, `msg="agent started"`, append([]string{"agent", "--store", store, "--interval", "1h", "--host-id", "onetest",
		"--spool", filepath.Join(t.TempDir(), "spool"), "--metrics-listen", "", "--pin-path", testPinPath(t, "oneshot")}, sockets...)...)

	d.Must(t, "run", "-d", "--name", "web", "--network", "dtonenet", "--ip", webIP, busybox, "httpd", "-f", "-p", port, "-h", "/www")
	waitListening(t, d, "web", port)
	webNS := netnsOf(t, d, "web")
	webID := d.Must(t, "inspect", "--format", "{{.Id}}", "web")
	cidFile := filepath.Join(t.TempDir(), "oneshot.cid")
	d.Must(t, "run", "--rm", "--cidfile", cidFile, "--name", "oneshot", "--network", "dtonenet", "--ip", oneshotIP, busybox,
		"wget", "-q", "-O", "/dev/null", "http://"+webIP+":"+port+"/")
	cid, err := os.ReadFile(cidFile)
	if err != nil {
		t.Fatal(err)
	}
	oneshotID := strings.TrimSpace(string(cid))
	root, err := kernel.CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "docker", oneshotID)); !os.IsNotExist(err) {
		t.Fatalf("the client's cgroup is still there (%v): the test would not test a gone container", err)
	}

	flows := jsonlFlows(t, trace.stop(t))
	agent.stop(t)

	// The trace: one connection each way, both ends named.
	var client, server []tracer.Flow
	for _, f := range flows {
		switch {
		case f.Direction == tracer.Outbound && f.LocalAddr == oneshotIP && f.RemoteAddr == webIP:
			client = append(client, f)
		case f.Direction == tracer.Inbound && f.LocalAddr == webIP && f.RemoteAddr == oneshotIP:
			server = append(server, f)
		default:
			t.Errorf("unexpected flow %s %s -> %s port %d by %s (netns %d)", f.Direction, f.LocalAddr, f.RemoteAddr, f.Port, f.Comm, f.NetNS)
		}
	}
	if len(client) != 1 || len(server) != 1 {
		t.Fatalf("flows: %d from the client, %d at the server; want one each:\n%+v", len(client), len(server), flows)
	}
	c, s := client[0], server[0]
	t.Logf("client: %s %s/%d in netns %d, container %s (%s); server: %s in netns %d, container %s",
		c.Comm, c.ContainerName, c.PID, c.NetNS, c.ContainerID, c.ContainerImage, s.Comm, s.NetNS, s.ContainerName)
	if c.Connections != 1 || s.Connections != 1 || c.FailedConnections+s.FailedConnections != 0 {
		t.Errorf("connections: client %d (%d failed), server %d (%d failed); want 1 each", c.Connections, c.FailedConnections, s.Connections, s.FailedConnections)
	}
	if c.ContainerName != "oneshot" || c.ContainerID != oneshotID || c.ContainerImage != busybox || c.ContainerRuntime != "docker" || c.Comm != "wget" {
		t.Errorf("the client is named %q (id %s, image %q, runtime %q, process %s); want oneshot (%s), %s, docker, wget",
			c.ContainerName, c.ContainerID, c.ContainerImage, c.ContainerRuntime, c.Comm, oneshotID, busybox)
	}
	if s.ContainerName != "web" || s.ContainerID != webID || s.NetNS != webNS {
		t.Errorf("the server is named %q (id %s, netns %d); want web (%s, %d)", s.ContainerName, s.ContainerID, s.NetNS, webID, webNS)
	}
	// Its namespace was gone before the drain: the agent could not read
	// its address from it.
	if list, err := netns.List(); err != nil {
		t.Fatal(err)
	} else {
		for _, n := range list {
			if n.Inode == c.NetNS {
				t.Fatalf("the client's namespace %d is still held by %s", c.NetNS, n.Path)
			}
		}
	}

	// The store and the graph: one edge into the web service, from the
	// client's process on its own host, named; no external client.
	// The client's namespace was gone before the agent saw it: its inode
	// alone names it. The web container's runs: its cookie too.
	webCookie, err := netns.CookieOf(webNS)
	if err != nil {
		t.Fatal(err)
	}
	clientHost, serverHost := dtagent.NamespaceHostID("onetest", c.NetNS, 0), dtagent.NamespaceHostID("onetest", webNS, webCookie)
	g := readGraph(t, bin, store, "--format", "json-v1")
	serviceID, clientID := graph.ServiceID(serverHost, "tcp", 8080), graph.ProcessID(clientHost, "wget")
	var into []graph.Edge
	for _, e := range g.Edges {
		if e.To == serviceID {
			into = append(into, e)
		}
	}
	if len(into) != 1 || into[0].From != clientID || into[0].Connections != 1 {
		t.Errorf("edges into %s: %+v; want one from %s with 1 connection", serviceID, into, clientID)
	}
	for _, n := range g.Nodes {
		if n.Kind == graph.KindExternal && n.Addr == oneshotIP {
			t.Errorf("the client is an external node: %+v", n)
		}
		if n.ID == clientID && (n.ContainerName != "oneshot" || n.ContainerID != oneshotID || n.ContainerImage != busybox) {
			t.Errorf("client node %+v: want container oneshot", n)
		}
		if n.ID == serviceID && (n.ContainerName != "web" || n.Process != "httpd") {
			t.Errorf("service node %+v: want container web, process httpd", n)
		}
	}
	// The workload graph: the two containers, one edge.
	g2 := readGraph(t, bin, store, "--format", "json")
	names := map[string]string{}
	for _, n := range g2.Nodes {
		names[n.ID] = n.ContainerName
	}
	var edges []string
	for _, e := range g2.Edges {
		if e.Proto == "tcp" && e.Port == 8080 {
			edges = append(edges, names[e.From]+" -> "+names[e.To])
		}
	}
	if len(edges) != 1 || edges[0] != "oneshot -> web" {
		t.Errorf("workload edges on tcp/8080: %q; want oneshot -> web", edges)
	}
	// look finds the client by its container's name, and its server.
	out, err := exec.Command(bin, "look", "oneshot", "--store", store, "--since", "1h").CombinedOutput()
	t.Logf("deptrace look oneshot:\n%s", out)
	if err != nil || !strings.Contains(string(out), "oneshot (wget) on "+clientHost) ||
		!strings.Contains(string(out), "-> tcp/8080 web (httpd) on "+serverHost) || strings.Contains(string(out), "external") {
		t.Errorf("look oneshot (%v): want the client and web, no external end", err)
	}
	if t.Failed() {
		out, _ := exec.Command(bin, "graph", "--store", store, "--since", "1h", "--format", "json-v1").Output()
		t.Logf("graph json-v1:\n%s", out)
	}
}

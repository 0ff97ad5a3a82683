package container_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	dtagent "github.com/deptrace/deptrace/internal/agent"
	"github.com/deptrace/deptrace/internal/dockertest"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// Docker's embedded DNS and a one-request client, on a network of their
// own: 198.51.100.208/28, between the suite's namespace hosts
// (198.51.100.1-200) and the other container tests' networks.
const (
	dnsSubnet  = "198.51.100.208/28"
	dnsGateway = "198.51.100.209"
	webIP      = "198.51.100.210"
	oneshotIP  = "198.51.100.211"
	dnsRounds  = 15 // each container resolves both others this many times
)

var dnsContainers = []string{"dns-a", "dns-b", "dns-c"}

// Docker's embedded DNS: three containers on a user-defined network
// resolve each other's names through 127.0.0.11:53 for a while, answered
// by dockerd from a socket it bound to a port the kernel chose, inside
// each container's namespace, behind a NAT rule. deptrace must see one
// DNS dependency per container (the container's resolver client ->
// 127.0.0.11:53, named by the container) and dockerd as the server of
// each, never dockerd as a client of the queries' ephemeral ports: in
// `deptrace trace`'s jsonl, then through the agent, the store and the
// graph.
func TestDockerDNSOneDependencyPerContainer(t *testing.T) {
	testnet.RequireRoot(t)
	bin := buildBinary(t)
	d := dockertest.Start(t)
	d.ImportBusybox(t, busybox)
	d.Must(t, "network", "create", "--driver", "bridge", "--subnet", dnsSubnet, "--gateway", dnsGateway,
		"-o", "com.docker.network.bridge.name=dtdns"+fmt.Sprint(os.Getpid()%100000), "dtdnsnet")

	store := filepath.Join(t.TempDir(), "deptrace.db")
	trace := startHost(t, bin, "msg=tracing", "trace", "--output", "jsonl", "--proto", "udp", "--interval", "1s",
		"--docker-socket", d.Socket, "--podman-socket", "", "--containerd-socket", "", "--crio-socket", "")
	agent := startHost(t, bin, `msg="agent started"`, "agent", "--store", store, "--interval", "1s", "--host-id", "dnstest",
		"--spool", filepath.Join(t.TempDir(), "spool"), "--metrics-listen", "", "--pin-path", testPinPath(t, "dns"),
		"--docker-socket", d.Socket, "--podman-socket", "", "--containerd-socket", "", "--crio-socket", "")

	// All three run before any resolves (a name not yet registered would
	// go to the host's upstream servers). Each resolves one peer once,
	// waits over a drain, then resolves both others dnsRounds times,
	// each nslookup from a new socket (a new ephemeral port).
	for _, name := range dnsContainers {
		d.Must(t, "run", "-d", "--name", name, "--network", "dtdnsnet", busybox, "sleep", "600")
	}
	for i, name := range dnsContainers {
		others := []string{dnsContainers[(i+1)%3], dnsContainers[(i+2)%3]}
		script := fmt.Sprintf(`nslookup %[1]s >/dev/null || { echo first lookup failed >/tmp/dns.out; exit 1; }; sleep 1.5
for i in $(seq %[3]d); do nslookup %[1]s >/dev/null && nslookup %[2]s >/dev/null || { echo lookup $i failed >/tmp/dns.out; exit 1; }; sleep 0.2; done
echo done >/tmp/dns.out`, others[0], others[1], dnsRounds)
		d.Must(t, "exec", "-d", name, "sh", "-c", script)
	}
	for _, name := range dnsContainers {
		pid := d.Must(t, "inspect", "--format", "{{.State.Pid}}", name)
		deadline := time.Now().Add(60 * time.Second)
		for {
			out, _ := os.ReadFile(filepath.Join("/proc", pid, "root", "tmp", "dns.out"))
			if string(out) == "done\n" {
				break
			}
			if len(out) > 0 || time.Now().After(deadline) {
				t.Fatalf("%s did not resolve its peers: %q", name, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	ns := map[string]uint32{}
	ids := map[string]string{}
	byNS := map[uint32]string{}
	for _, name := range dnsContainers {
		ns[name] = netnsOf(t, d, name)
		ids[name] = d.Must(t, "inspect", "--format", "{{.Id}}", name)
		byNS[ns[name]] = name
	}
	time.Sleep(1500 * time.Millisecond) // the last answers into a drain of both
	out := trace.stop(t)
	flows := jsonlFlows(t, out)
	lookups := jsonlDNS(t, out)
	agent.stop(t)

	// The trace: per container, its flows on UDP.
	type view struct {
		dns       tracer.Flow // the container's client flow to 127.0.0.11:53, summed
		forwarder tracer.Flow // dockerd's inbound flow, summed
		fwdPorts  map[uint16]bool
	}
	views := map[string]*view{}
	for _, name := range dnsContainers {
		views[name] = &view{fwdPorts: map[uint16]bool{}}
	}
	for _, f := range flows {
		name, ok := byNS[f.NetNS]
		if !ok {
			continue
		}
		v := views[name]
		switch {
		case f.Direction == tracer.Outbound && f.RemoteAddr == "127.0.0.11" && f.Port == 53:
			if f.ContainerName != name || f.ContainerID != ids[name] || f.ContainerImage != busybox {
				t.Errorf("%s: DNS flow named %q (id %s, image %q)", name, f.ContainerName, f.ContainerID, f.ContainerImage)
			}
			v.dns.Counters.Add(f.Counters)
			v.dns.Comm = f.Comm
		case f.Direction == tracer.Inbound && f.Comm == "dockerd" && f.LocalAddr == "127.0.0.11":
			v.forwarder.Counters.Add(f.Counters)
			v.fwdPorts[f.Port] = true
		default:
			t.Errorf("%s: unexpected UDP flow %s %s %s -> %s port %d by %s/%d (%d datagrams sent, %d received)", name, f.Time.Format("15:04:05.000"),
				f.Direction, f.LocalAddr, f.RemoteAddr, f.Port, f.Comm, f.PID, f.DatagramsSent, f.DatagramsReceived)
		}
	}
	for _, name := range dnsContainers {
		v := views[name]
		t.Logf("%s (netns %d): %s -> 127.0.0.11:53: %d datagrams sent, %d received; dockerd inbound on %v: %d received, %d sent",
			name, ns[name], v.dns.Comm, v.dns.DatagramsSent, v.dns.DatagramsReceived, v.fwdPorts, v.forwarder.DatagramsReceived, v.forwarder.DatagramsSent)
		// Each nslookup asks twice (A and AAAA): once first, then for
		// two names per round.
		if want := uint64(2 + 4*dnsRounds); v.dns.DatagramsSent < want || v.dns.DatagramsReceived == 0 {
			t.Errorf("%s: DNS client flow with %d datagrams sent, %d received; want at least %d sent", name, v.dns.DatagramsSent, v.dns.DatagramsReceived, want)
		}
		if len(v.fwdPorts) != 1 {
			t.Errorf("%s: dockerd's forwarder on ports %v, want one", name, v.fwdPorts)
		}
		// Every query the client sent reached dockerd, every answer came
		// back: the two ends of one dependency agree.
		if v.forwarder.DatagramsReceived != v.dns.DatagramsSent || v.forwarder.DatagramsSent != v.dns.DatagramsReceived {
			t.Errorf("%s: client sent %d and received %d datagrams, dockerd received %d and sent %d", name,
				v.dns.DatagramsSent, v.dns.DatagramsReceived, v.forwarder.DatagramsReceived, v.forwarder.DatagramsSent)
		}
		// DNS health: the container's lookups, named by the container,
		// against the resolver it addressed: every datagram it sent a
		// query, every one answered, with a latency each.
		var c tracer.DNSCounters
		for _, d := range lookups {
			if d.NetNS != ns[name] {
				continue
			}
			if d.Resolver != "127.0.0.11:53" || d.Proto != tracer.ProtoUDP || d.ContainerName != name || d.ContainerID != ids[name] || d.Comm != "nslookup" {
				t.Errorf("%s: DNS record of %s (container %q, %s) through %s %s", name, d.Comm, d.ContainerName, d.ContainerID, d.Proto, d.Resolver)
				continue
			}
			c.Add(d.DNSCounters)
		}
		t.Logf("%s: lookups %+v", name, c)
		if c.Queries != v.dns.DatagramsSent || c.Answers != c.Queries || c.NoError+c.NXDomain != c.Answers || c.Timeouts != 0 || c.LatencyCount != c.Answers || c.Unparsed != 0 {
			t.Errorf("%s: lookups %+v; want %d queries, each answered (NOERROR or NXDOMAIN) with a latency", name, c, v.dns.DatagramsSent)
		}
	}

	// The agent, the store and the graph: per container one DNS edge,
	// from the container's workload to the DNS service on its own
	// namespace's host, served by dockerd (the graph joins the NAT rule's
	// two ends: the port the client asked, the port dockerd listens on),
	// and no other UDP edge.
	g := readGraph(t, bin, store, "--format", "json")
	hosts := map[string]string{}
	for _, name := range dnsContainers {
		cookie, err := netns.CookieOf(ns[name]) // the container runs: its namespace's host id has it
		if err != nil {
			t.Fatal(err)
		}
		hosts[dtagent.NamespaceHostID("dnstest", ns[name], cookie)] = name
	}
	nodes := map[string]graph.Node{}
	for _, n := range g.Nodes {
		nodes[n.ID] = n
	}
	dnsEdges := map[string]int{}
	for _, e := range g.Edges {
		from, to := nodes[e.From], nodes[e.To]
		name, ours := hosts[to.Host]
		if !ours {
			name, ours = hosts[from.Host]
		}
		if !ours || e.Proto != "udp" {
			continue
		}
		if e.Port == 53 && from.Host == to.Host && from.ContainerName == name && from.ContainerID == ids[name] && from.Process == "nslookup" && to.Process == "dockerd" {
			dnsEdges[name]++
		} else {
			t.Errorf("%s: unexpected UDP edge %s (%s) -> %s (%s, process %q), port %d", name, e.From, from.Name, e.To, to.Name, to.Process, e.Port)
			continue
		}
		t.Logf("edge %s (%s) -> %s (%s) udp/%d: %d datagrams sent, %d received", e.From, from.Name, e.To, to.Name, e.Port, e.DatagramsSent, e.DatagramsReceived)
	}
	for _, name := range dnsContainers {
		if dnsEdges[name] != 1 {
			t.Errorf("%s: %d DNS edges from the container to dockerd's DNS service in the graph, want 1", name, dnsEdges[name])
		}
	}
	if t.Failed() {
		out, _ := exec.Command(bin, "graph", "--store", store, "--since", "1h", "--format", "json-v1").Output()
		t.Logf("graph json-v1:\n%s", out)
	}
}

// jsonlDNS is the "dns" records of trace's jsonl output.
func jsonlDNS(t *testing.T, out []byte) []tracer.DNS {
	t.Helper()
	var recs []tracer.DNS
	for _, line := range bytes.Split(out, []byte("\n")) {
		if !bytes.Contains(line, []byte(`"kind":"dns"`)) {
			continue
		}
		var d tracer.DNS
		if err := json.Unmarshal(line, &d); err != nil {
			t.Fatalf("jsonl line %q: %v", line, err)
		}
		recs = append(recs, d)
	}
	return recs
}

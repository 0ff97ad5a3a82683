package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dtagent "github.com/deptrace/deptrace/internal/agent"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/testnet"
)

// A short-lived client (a namespace created, used for a few requests by
// a process in a systemd-style unit, and removed, like a `docker run
// --rm` container) whose namespace is gone before the agent drains: the
// agent cannot read its addresses any more, yet the store learns them
// from its own flow, so the graph joins it to the server's inbound end
// (one edge, no external node), and names it by its unit; look finds it
// by that unit. Through the agent binary and both stores.
func TestShortLivedClientIsJoined(t *testing.T) {
	testnet.RequireRoot(t)
	for name, spec := range map[string]string{
		"sqlite":   filepath.Join(t.TempDir(), "deptrace.db"),
		"postgres": pgtest.Start(t),
	} {
		t.Run(name, func(t *testing.T) { shortLivedClientIsJoined(t, spec) })
	}
}

func shortLivedClientIsJoined(t *testing.T, dsn string) {
	nw := testnet.New(t, 1)
	server := nw.Hosts[0]
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	roles := t.TempDir()
	if err := os.Chmod(roles, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dbserver", "client"} {
		if err := os.Symlink(self, filepath.Join(roles, name)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := net.JoinHostPort(server.IPv4.String(), "5432")
	srv := server.Command(ctx, filepath.Join(roles, "dbserver"), addr)
	out, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "ready" {
		t.Fatalf("server did not start: %q", line)
	}

	// The only drain that sees the client is the agent's last one, at
	// SIGTERM, after the client's namespace and cgroup are gone.
	agent := startReady(t, "msg=\"agent started\"", "agent", "--store", dsn, "--interval", "1h",
		"--host-id", "jointest", "--spool", filepath.Join(t.TempDir(), "spool"), "--metrics-listen", "",
		"--pin-path", testPinPath(t, "join"), "--docker-socket", "", "--podman-socket", "", "--containerd-socket", "", "--crio-socket", "")

	// The client's namespace: one more interface on the test bridge.
	ns := fmt.Sprintf("%s-oneshot", nw.Bridge)
	clientIP := "198.51.100.77"
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", "p77", "netns", nw.Bridge},
		{"-n", ns, "addr", "add", clientIP + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", nw.Bridge, "link", "set", "p77", "master", "br0"},
		{"-n", nw.Bridge, "link", "set", "p77", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			_ = exec.Command("ip", "netns", "del", ns).Run()
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ino, err := netns.Inode(netns.NamedDir + "/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	// Its process runs in a unit's cgroup, as systemd starts a service's.
	root, err := kernel.CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	slice := filepath.Join(root, "system.slice")
	if err := os.Mkdir(slice, 0o755); err == nil {
		t.Cleanup(func() { os.Remove(slice) }) // fails, harmlessly, if others use it
	} else if !os.IsExist(err) {
		t.Fatal(err)
	}
	unit := fmt.Sprintf("deptrace-join-%d.service", os.Getpid())
	dir := filepath.Join(slice, unit)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	cg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	const requests = 3
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, filepath.Join(roles, "client"), addr, strconv.Itoa(requests))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	out2, err := cmd.CombinedOutput()
	cg.Close()
	if err != nil {
		_ = exec.Command("ip", "netns", "del", ns).Run()
		t.Fatalf("client: %v: %s", err, out2)
	}
	// Gone: the namespace (its veth with it) and the unit's cgroup.
	if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	waitUntil(t, 10*time.Second, "the client's cgroup is removed", func() error { return os.Remove(dir) })
	waitUntil(t, 10*time.Second, "the client's namespace is gone", func() error {
		if list, err := netns.List(); err != nil {
			return err
		} else {
			for _, n := range list {
				if n.Inode == ino {
					return fmt.Errorf("namespace %d still held by %s", ino, n.Path)
				}
			}
		}
		return nil
	})

	agent.cmd.Process.Signal(syscall.SIGTERM)
	agent.wait(t)

	stdout, stderr, code := run(t, nil, "graph", "--format", "json-v1", "--store", dsn)
	if code != 0 {
		t.Fatalf("graph: %s", stderr)
	}
	var g graph.Graph
	if err := json.Unmarshal([]byte(stdout), &g); err != nil {
		t.Fatal(err)
	}
	clientHost := dtagent.NamespaceHostID("jointest", ino, 0) // gone before the agent saw it: no cookie
	clientID := graph.ProcessID(clientHost, "client")
	serviceID := graph.ServiceID("jointest/"+server.Name, "tcp", 5432)
	var joined []graph.Edge
	for _, e := range g.Edges {
		if e.To == serviceID {
			joined = append(joined, e)
		}
	}
	if len(joined) != 1 || joined[0].From != clientID || joined[0].Connections != requests {
		t.Errorf("edges into %s: %+v; want one from %s with %d connections", serviceID, joined, clientID, requests)
	}
	for _, n := range g.Nodes {
		if n.Kind == graph.KindExternal && n.Addr == clientIP {
			t.Errorf("the client is also an external node: %+v", n)
		}
		if n.ID == clientID && (n.Unit != unit || n.ContainerID != "") {
			t.Errorf("client node %+v: want unit %s", n, unit)
		}
	}
	// look finds it by its unit, with or without the suffix.
	for _, target := range []string{unit, strings.TrimSuffix(unit, ".service")} {
		stdout, stderr, code = run(t, nil, "look", target, "--group-by", "process", "--store", dsn)
		if code != 0 || !strings.Contains(stdout, "client ["+unit+"] on "+clientHost) || !strings.Contains(stdout, "dbserver on jointest/"+server.Name) {
			t.Errorf("look %s (%d): %s%s", target, code, stdout, stderr)
		}
	}
}

// waitUntil polls cond until it returns nil, failing the test with its
// last error after limit.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %v", what, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The agent shares trace's identity flags, validated the same way.
func TestAgentIdentityFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--identity-retain", "0s"}, "invalid --identity-retain 0s: allowed 1s to 24h"},
		{[]string{"--metrics-identity-max", "0"}, "invalid --metrics-identity-max 0: allowed 1 or more"},
	} {
		_, stderr, code := run(t, nil, append([]string{"agent", "--store", filepath.Join(t.TempDir(), "x.db")}, c.args...)...)
		if code != 1 || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("agent %v: exit %d, %q; want one line with %q", c.args, code, stderr, c.want)
		}
	}
	stdout, _, _ := run(t, nil, "agent", "--help")
	for _, f := range []string{"--no-identity", "--docker-socket", "--podman-socket", "--containerd-socket", "--crio-socket", "--identity-retain", "--metrics-identity"} {
		if !strings.Contains(stdout, f) {
			t.Errorf("agent --help lacks %s", f)
		}
	}
}

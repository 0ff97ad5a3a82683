package identity_test

// Privileged tests: they load the real tracer, make real cgroups and run
// real processes (and, in docker_priv_test.go, a real dockerd). They skip
// without root on a laptop and fail under CI=true.

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/identity"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// helperEnv makes the test binary a one-request TCP client: it dials the
// address, writes a request, reads the answer and exits.
const helperEnv = "DEPTRACE_IDENTITY_TEST_DIAL"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		os.Exit(dialOnce(addr))
	}
	os.Exit(m.Run())
}

func dialOnce(addr string) int {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := io.ReadAll(c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func startTracer(t *testing.T) *tracer.Tracer {
	t.Helper()
	testnet.RequireRoot(t)
	tr, err := tracer.New(tracer.DefaultConfig())
	if err != nil {
		t.Fatalf("load tracer: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	if _, _, err := tr.Seeded(); err != nil {
		t.Fatalf("seed: %v", err)
	}
	return tr
}

func startResolver(t *testing.T, cfg identity.Config) *identity.Resolver {
	t.Helper()
	r, err := identity.New(cfg)
	if err != nil {
		t.Fatalf("identity: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// serveOnce answers every connection on ln with "pong" after reading a
// line, until ln is closed.
func serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 5)
			_, _ = io.ReadFull(c, buf)
			_, _ = c.Write([]byte("pong\n")) // the peer: a lost reply fails the client
		}()
	}
}

// A process in a systemd-style service cgroup (/system.slice/x.service
// under the cgroup2 mount) is named by its unit, also when the process
// and its cgroup are gone by the drain; the end in the test's own cgroup
// is named by what its path says (nothing, for a plain host process).
func TestSystemdUnitNamed(t *testing.T) {
	testnet.RequireRoot(t)
	root, err := kernel.CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	cfg := identity.DefaultConfig()
	cfg.DockerSocket, cfg.PodmanSocket, cfg.ContainerdSocket, cfg.CRIOSocket = "", "", "", ""
	res := startResolver(t, cfg) // before the cgroup exists: it learns it as it is made
	tr := startTracer(t)

	slice := filepath.Join(root, "system.slice")
	if err := os.Mkdir(slice, 0o755); err == nil {
		t.Cleanup(func() { os.Remove(slice) }) // fails, harmlessly, if others use it
	} else if !os.IsExist(err) {
		t.Fatal(err)
	}
	unit := fmt.Sprintf("deptrace-test-%d.service", os.Getpid())
	dir := filepath.Join(slice, unit)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go serve(ln)
	port := uint16(ln.Addr().(*net.TCPAddr).Port)

	// The client starts inside the unit's cgroup (clone3 CLONE_INTO_CGROUP),
	// as systemd starts a service's processes.
	cg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+ln.Addr().String())
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	out, err := cmd.CombinedOutput()
	cg.Close()
	if err != nil {
		t.Fatalf("client in %s: %v: %s", dir, err, out)
	}
	// The unit's only process is gone; so is its cgroup, before the drain.
	var rmErr error
	for range 50 {
		if rmErr = os.Remove(dir); rmErr == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rmErr != nil {
		t.Fatalf("remove %s: %v", dir, rmErr)
	}

	var client, server *tracer.Flow
	deadline := time.Now().Add(10 * time.Second)
	for client == nil || server == nil {
		if time.Now().After(deadline) {
			t.Fatalf("flows on port %d: client %v, server %v", port, client, server)
		}
		time.Sleep(200 * time.Millisecond)
		iv, err := tr.Collect()
		if err != nil {
			t.Fatal(err)
		}
		res.Annotate(iv.Flows)
		for i := range iv.Flows {
			f := &iv.Flows[i]
			if f.Proto != tracer.ProtoTCP || f.Port != port || f.RemoteAddr != "127.0.0.1" {
				continue
			}
			switch {
			case f.Direction == tracer.Outbound && f.PID == uint32(cmd.Process.Pid):
				client = f
			case f.Direction == tracer.Inbound && f.PID == uint32(os.Getpid()):
				server = f
			}
		}
	}
	if client.Identity != (tracer.Identity{Unit: unit}) {
		t.Errorf("client in %s: identity %+v, want unit %s", dir, client.Identity, unit)
	}
	b, _ := json.Marshal(client)
	if !strings.Contains(string(b), `"unit":"`+unit+`"`) || strings.Contains(string(b), "container") {
		t.Errorf("client jsonl: %s", b)
	}
	// The test process's own end: what its cgroup path says, nothing for
	// the root cgroup of a plain host.
	own, _ := identity.PIDCgroupV2(os.Getpid())
	want := tracer.Identity{Unit: identity.ParsePath(own).Unit}
	if server.Identity != want {
		t.Errorf("server in %q: identity %+v, want %+v", own, server.Identity, want)
	}
	if want.Empty() {
		b, _ := json.Marshal(server)
		for _, k := range []string{`"unit"`, `"container_`, `"pod_`, `"workload"`, `"k8s_container"`} {
			if strings.Contains(string(b), k) {
				t.Errorf("host process's flow carries %s: %s", k, b)
			}
		}
	}
}

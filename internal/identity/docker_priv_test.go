package identity_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/dockertest"
	"github.com/deptrace/deptrace/internal/identity"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/output"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// The containers' network: inside TEST-NET-2, which the suite's namespace
// hosts use (198.51.100.1-200, only inside their own namespaces); this
// /28 is above them.
const (
	dockerSubnet  = "198.51.100.240/28"
	dockerGateway = "198.51.100.241"
	webIP         = "198.51.100.242"
	frontendIP    = "198.51.100.243"
	testImage     = "deptrace-test/busybox:1"
)

// hex64 is a full container id.
var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Containers on a user-defined bridge network are named with their
// container name, image, runtime and Compose workload: a client, a server,
// and a `docker run --rm` client that made one request and was gone,
// cgroup and all, before the drain.
func TestDockerContainersNamed(t *testing.T) {
	testnet.RequireRoot(t)
	d := dockertest.Start(t)
	d.ImportBusybox(t, testImage)
	d.Must(t, "network", "create", "--driver", "bridge", "--subnet", dockerSubnet, "--gateway", dockerGateway,
		"-o", "com.docker.network.bridge.name=dtid"+fmt.Sprint(os.Getpid()%100000), "dtnet")

	cfg := identity.DefaultConfig()
	cfg.DockerSocket, cfg.PodmanSocket, cfg.ContainerdSocket, cfg.CRIOSocket = d.Socket, "", "", ""
	res := startResolver(t, cfg)
	tr := startTracer(t)

	compose := func(svc string) []string {
		return []string{"--label", "com.docker.compose.project=shop", "--label", "com.docker.compose.service=" + svc}
	}
	run := func(args ...string) string { return d.Must(t, append([]string{"run"}, args...)...) }
	run(append(append([]string{"-d", "--name", "web", "--network", "dtnet", "--ip", webIP}, compose("web")...),
		testImage, "httpd", "-f", "-p", "80", "-h", "/www")...)
	run(append(append([]string{"-d", "--name", "frontend", "--network", "dtnet", "--ip", frontendIP}, compose("frontend")...),
		testImage, "sh", "-c", "while true; do wget -q -O /dev/null http://"+webIP+"/; sleep 0.2; done")...)
	// One request, then gone: --rm removes the container and its cgroup
	// before `docker run` returns.
	for try := 0; ; try++ {
		_, err := d.Run(append(append([]string{"run", "--rm", "--name", "oneshot", "--network", "dtnet"}, compose("oneshot")...),
			testImage, "wget", "-q", "-O", "/dev/null", "http://"+webIP+"/")...)
		if err == nil {
			break
		}
		if try == 20 { // httpd not up yet: a refused connect, then retry
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}

	byName := map[string]tracer.Flow{}
	deadline := time.Now().Add(15 * time.Second)
	for byName["frontend"].Connections == 0 || byName["oneshot"].Connections == 0 || byName["web"].Connections == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("flows on port 80 by container: %+v", byName)
		}
		time.Sleep(300 * time.Millisecond)
		iv, err := tr.Collect()
		if err != nil {
			t.Fatal(err)
		}
		res.Annotate(iv.Flows)
		for _, f := range iv.Flows {
			if f.Proto != tracer.ProtoTCP || f.Port != 80 || (f.RemoteAddr != webIP && f.LocalAddr != webIP) || f.ContainerName == "" {
				continue
			}
			if old, ok := byName[f.ContainerName]; ok {
				f.Counters.Add(old.Counters)
			}
			byName[f.ContainerName] = f
		}
	}
	root, err := kernel.CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]tracer.Direction{"frontend": tracer.Outbound, "oneshot": tracer.Outbound, "web": tracer.Inbound} {
		f := byName[name]
		id := f.Identity
		if f.Direction != dir || id.ContainerImage != testImage || id.ContainerRuntime != identity.RuntimeDocker ||
			id.Workload != "compose/shop/"+name || !hex64.MatchString(id.ContainerID) || id.Unit != "" || id.PodName != "" {
			t.Errorf("%s: %s flow, identity %+v", name, f.Direction, id)
		}
		row := output.TableRow(f, nil)
		t.Logf("%s", strings.Join(row, "  "))
		proc := row[5]
		if !strings.HasPrefix(proc, name+"(") {
			t.Errorf("%s: PROCESS column %q", name, proc)
		}
		if name == "oneshot" {
			// Named although its cgroup was gone before the drain.
			if _, err := os.Stat(filepath.Join(root, "docker", id.ContainerID)); !os.IsNotExist(err) {
				t.Errorf("oneshot's cgroup still there at the drain (%v): the test did not test a gone container", err)
			}
			if f.RemoteAddr != webIP {
				t.Errorf("oneshot: flow to %s", f.RemoteAddr)
			}
		}
	}
	if f := byName["frontend"]; f.LocalAddr != frontendIP {
		t.Errorf("frontend's flow from %s", f.LocalAddr)
	}
}

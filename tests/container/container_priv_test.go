package container_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/dockertest"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/packaging/ociimage"
)

// The containers' network: inside TEST-NET-2, like the suite's namespace
// hosts (198.51.100.1-200, internal/testnet) and internal/identity's docker
// test (198.51.100.240/28); this /28 is between them.
const (
	subnet       = "198.51.100.224/28"
	gateway      = "198.51.100.225"
	serverIP     = "198.51.100.226"
	clientIP     = "198.51.100.227"
	port         = "8080"
	requests     = 5
	busybox      = "deptrace-test/busybox:1"
	imageVersion = "0.0.0~test"
)

var repoRoot = filepath.Join("..", "..")

// buildImage builds the static binary and the image tarball the way `make
// build` and `make image` do.
func buildImage(t *testing.T) (tarball, ref string) {
	t.Helper()
	goBin := dockertest.Need(t, "go", "golang-go")
	dir := t.TempDir()
	bin := buildBinary(t)
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	rev, _ := exec.Command("git", "-C", repoRoot, "rev-parse", "HEAD").Output()
	img := ociimage.Image{Binary: b, Name: "deptrace/deptrace", Version: imageVersion, Arch: goarch(t, goBin),
		Revision: strings.TrimSpace(string(rev)), Source: "https://github.com/deptrace/deptrace", Created: time.Unix(0, 0)}
	tarball = filepath.Join(dir, "deptrace.oci.tar")
	f, err := os.Create(tarball)
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.Write(f, img); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(tarball)
	t.Logf("image %s: %.1f MB", img.Ref(), float64(st.Size())/1e6)
	return tarball, img.Ref()
}

func goarch(t *testing.T, goBin string) string {
	out, err := exec.Command(goBin, "env", "GOARCH").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// unitCaps are the capabilities the systemd unit grants: the container gets
// exactly these, as docs/operations.md says.
func unitCaps(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "packaging", "deptrace.service"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^AmbientCapabilities=(.*)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no AmbientCapabilities in packaging/deptrace.service")
	}
	return strings.Fields(string(m[1]))
}

// flow is the part of a jsonl flow record the test reads.
type flow struct {
	Kind, Proto, Direction string
	LocalAddr              string `json:"local_addr"`
	RemoteAddr             string `json:"remote_addr"`
	Port                   int
	ContainerID            string `json:"container_id"`
	ContainerName          string `json:"container_name"`
	ContainerImage         string `json:"container_image"`
	ContainerRuntime       string `json:"container_runtime"`
	Connections            uint64
	FailedConnections      uint64 `json:"failed_connections"`
	BytesSent              uint64 `json:"bytes_sent"`
	BytesReceived          uint64 `json:"bytes_received"`
}

// The image loads into Docker (`docker load`) and containerd (`ctr images
// import`), runs as documented (host PID and network namespaces, the
// unit's capabilities and no others, the default seccomp profile, a
// read-only root, bpffs, BTF and the cgroup tree mounted, the Docker socket
// read-only; under Docker, or under Docker's containerd where this Docker
// cannot grant those capabilities, see startAgent), and `deptrace trace` in
// it names the two Docker containers that talk over TCP on each end of
// their flows, with exact connection counts.
func TestImageRunsAndNamesContainers(t *testing.T) {
	testnet.RequireRoot(t)
	tarball, ref := buildImage(t)
	d := dockertest.Start(t)

	if out := d.Must(t, "load", "-i", tarball); !strings.Contains(out, "Loaded image: "+ref) {
		t.Fatalf("docker load: %s", out)
	}
	var labels map[string]string
	if err := json.Unmarshal([]byte(d.Must(t, "image", "inspect", "--format", "{{json .Config.Labels}}", ref)), &labels); err != nil {
		t.Fatal(err)
	}
	if labels["org.opencontainers.image.version"] != imageVersion || labels["org.opencontainers.image.source"] == "" {
		t.Errorf("image labels: %v", labels)
	}
	ctr := importIntoContainerd(t, d, tarball, ref)

	d.ImportBusybox(t, busybox)
	d.Must(t, "network", "create", "--driver", "bridge", "--subnet", subnet, "--gateway", gateway,
		"-o", "com.docker.network.bridge.name=dtct"+fmt.Sprint(os.Getpid()%100000), "dtctnet")
	agent := startAgent(t, d, ctr, ref, agentRun{id: "ct-trace", ready: "msg=tracing",
		args: []string{"trace", "--output", "jsonl", "--duration", "15s", "--proto", "tcp", "--port", port}})
	// The server starts under the tracer, as in internal/identity's docker
	// test: the server end of a listener older than the tracer has no
	// cgroup id today (reported, not asserted here).
	d.Must(t, "run", "-d", "--name", "ct-server", "--network", "dtctnet", "--ip", serverIP, busybox, "httpd", "-f", "-p", port, "-h", "/www")
	waitListening(t, d, "ct-server", port)

	d.Must(t, "run", "-d", "--name", "ct-client", "--network", "dtctnet", "--ip", clientIP, busybox, "sh", "-c",
		fmt.Sprintf("for i in $(seq %d); do wget -q -O /dev/null http://%s:%s/ || exit 1; done; echo done; sleep 60", requests, serverIP, port))

	stdout, stderr, err := agent.wait()
	t.Logf("deptrace stderr:\n%s", stderr)
	if err != nil {
		t.Fatalf("deptrace in its container: %v", err)
	}
	if out, _ := d.Logs(t, "ct-client"); string(out) != "done\n" {
		t.Fatalf("client did not make its %d requests: %q", requests, out)
	}

	type key struct{ name, dir, local, remote string }
	got := map[key]flow{}
	s := bufio.NewScanner(bytes.NewReader(stdout))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		var f flow
		if err := json.Unmarshal(s.Bytes(), &f); err != nil {
			t.Fatalf("jsonl line %q: %v", s.Text(), err)
		}
		if f.Kind != "flow" {
			continue
		}
		k := key{f.ContainerName, f.Direction, f.LocalAddr, f.RemoteAddr}
		if old, ok := got[k]; ok {
			f.Connections += old.Connections
			f.FailedConnections += old.FailedConnections
			f.BytesSent += old.BytesSent
			f.BytesReceived += old.BytesReceived
		}
		got[k] = f
	}
	ids := map[string]string{}
	for _, name := range []string{"ct-client", "ct-server"} {
		ids[name] = d.Must(t, "inspect", "--format", "{{.Id}}", name)
	}
	want := map[key]string{
		{"ct-client", "outbound", clientIP, serverIP}: ids["ct-client"],
		{"ct-server", "inbound", serverIP, clientIP}:  ids["ct-server"],
	}
	for k, id := range want {
		f, ok := got[k]
		if !ok {
			t.Errorf("no flow %+v in the jsonl", k)
			continue
		}
		t.Logf("%s %s %s -> %s: %d connections, %d bytes sent, %d received, image %s", k.name, k.dir, k.local, k.remote,
			f.Connections, f.BytesSent, f.BytesReceived, f.ContainerImage)
		if f.Connections != requests || f.FailedConnections != 0 || f.Proto != "tcp" || f.Port != 8080 {
			t.Errorf("%s: %d connections (%d failed), want %d", k.name, f.Connections, f.FailedConnections, requests)
		}
		if f.ContainerImage != busybox || f.ContainerRuntime != "docker" || f.ContainerID != id {
			t.Errorf("%s: image %q, runtime %q, id %q; want %s, docker, %s", k.name, f.ContainerImage, f.ContainerRuntime, f.ContainerID, busybox, id)
		}
	}
	for k, f := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected flow %+v: %+v", k, f)
		}
	}
	if t.Failed() {
		t.Logf("deptrace's jsonl:\n%s", stdout)
	}

	t.Run("agent", func(t *testing.T) { checkAgent(t, d, ctr, ref) })
}

// checkAgent runs `deptrace agent` from the image with the documented
// mounts: it pins its kernel side in the host's bpffs, takes its lock in
// /run/deptrace, writes its store in /var/lib/deptrace despite the
// read-only root, and on SIGTERM stops cleanly, detaching its pins.
func checkAgent(t *testing.T, d *dockertest.Daemon, ctr *containerd, ref string) {
	// Under the prefix internal/testnet clears if this process dies.
	pin := fmt.Sprintf("/sys/fs/bpf/deptrace-test-%d-image", os.Getpid())
	t.Cleanup(func() { os.RemoveAll(pin) })
	a := startAgent(t, d, ctr, ref, agentRun{id: "ct-agent", ready: `msg="agent started"`,
		args: []string{"agent", "--pin-path", pin, "--metrics-listen", "", "--interval", "1s"}})
	if _, err := os.Stat(pin); err != nil {
		t.Errorf("no kernel side pinned in the host's bpffs: %v", err)
	}
	db := filepath.Join(a.state, "deptrace.db")
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(db); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no store at %s", db)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	a.stop()
	_, stderr, err := a.wait()
	t.Logf("agent stderr:\n%s", stderr)
	if err != nil {
		t.Fatalf("agent in its container: %v", err)
	}
	if bytes.Contains(stderr, []byte("level=ERROR")) {
		t.Error("the agent logged an error")
	}
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("pins left at %s after a clean stop (%v)", pin, err)
	}
}

// waitListening waits for a container's TCP listener on port, read from
// its /proc/PID/net/tcp{,6} (no probe connection: every connection counts).
func waitListening(t *testing.T, d *dockertest.Daemon, name, port string) {
	t.Helper()
	pid := d.Must(t, "inspect", "--format", "{{.State.Pid}}", name)
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	local := fmt.Sprintf(":%04X ", p)
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, f := range []string{"tcp", "tcp6"} {
			b, _ := os.ReadFile(filepath.Join("/proc", pid, "net", f))
			for _, line := range strings.Split(string(b), "\n") {
				// sl local_address rem_address st: 0A is LISTEN.
				if fields := strings.Fields(line); len(fields) > 3 && strings.HasSuffix(fields[1]+" ", local) && fields[3] == "0A" {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listening on %s", name, port)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

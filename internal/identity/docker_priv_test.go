package identity_test

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

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

// need finds a program the test needs: a skip on a laptop, a failure in CI.
func need(t *testing.T, prog, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(prog)
	if err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		if _, err := os.Stat(filepath.Join(dir, prog)); err == nil {
			return filepath.Join(dir, prog)
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not installed (Debian package %s; scripts/deps.sh installs it)", prog, pkg)
	}
	t.Skipf("%s not installed (apt-get install %s)", prog, pkg)
	return ""
}

// hostState is what dockerd may change on the machine and other tests
// depend on (kernel.md): the FORWARD policy and bridge netfilter, which
// silence the suite's bridged namespaces if left as dockerd sets them.
type hostState struct {
	forwardPolicy string
	sysctls       map[string]string
}

var hostSysctls = []string{
	"/proc/sys/net/bridge/bridge-nf-call-iptables",
	"/proc/sys/net/bridge/bridge-nf-call-ip6tables",
	"/proc/sys/net/bridge/bridge-nf-call-arptables",
	"/proc/sys/net/ipv4/ip_forward",
}

func saveHostState(t *testing.T) hostState {
	s := hostState{sysctls: map[string]string{}}
	for _, p := range hostSysctls {
		if b, err := os.ReadFile(p); err == nil {
			s.sysctls[p] = strings.TrimSpace(string(b))
		}
	}
	if out, err := exec.Command("iptables", "-S", "FORWARD").Output(); err == nil {
		if f := strings.Fields(strings.SplitN(string(out), "\n", 2)[0]); len(f) == 3 && f[0] == "-P" {
			s.forwardPolicy = f[2]
		}
	}
	return s
}

func (s hostState) restore(t *testing.T) {
	for _, p := range hostSysctls {
		v, had := s.sysctls[p]
		if !had {
			// br_netfilter was loaded meanwhile: turn it off again.
			if _, err := os.Stat(p); err != nil || !strings.Contains(p, "bridge-nf") {
				continue
			}
			v = "0"
		}
		if b, _ := os.ReadFile(p); strings.TrimSpace(string(b)) != v {
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				t.Errorf("restore %s=%s: %v", p, v, err)
			}
		}
	}
	if s.forwardPolicy != "" {
		if out, err := exec.Command("iptables", "-P", "FORWARD", s.forwardPolicy).CombinedOutput(); err != nil {
			t.Errorf("restore FORWARD policy %s: %v: %s", s.forwardPolicy, err, out)
		}
	}
}

// dockerd is a daemon of the test's own: its data, state and socket in a
// temp dir, no default bridge, and no iptables, forwarding or masquerade
// changes to the machine.
type dockerd struct {
	dir, socket, cli string
}

func startDockerd(t *testing.T) *dockerd {
	t.Helper()
	bin := need(t, "dockerd", "docker.io")
	cli := "/usr/bin/docker" // Debian's client, matching its daemon's API
	if _, err := os.Stat(cli); err != nil {
		cli = need(t, "docker", "docker.io")
	}
	need(t, "busybox", "busybox-static")
	dir, err := os.MkdirTemp("", "dtid")
	if err != nil {
		t.Fatal(err)
	}
	d := &dockerd{dir: dir, socket: filepath.Join(dir, "docker.sock"), cli: cli}
	state := saveHostState(t)
	newCgroups := absentDockerCgroups()
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "docker.pid"), "--config-file", filepath.Join(dir, "daemon.json"),
		"-H", "unix://"+d.socket, "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
		"--bridge=none", "--userland-proxy=false", "--exec-opt", "native.cgroupdriver=cgroupfs", "--log-level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// Containers first, then the daemon, then what it may have left.
		_, _ = d.run(t, "rm", "-f", "web", "frontend", "oneshot")
		_, _ = d.run(t, "network", "rm", "dtnet")
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		state.restore(t)
		for _, p := range newCgroups {
			os.Remove(p) // the daemon's parent cgroup, empty now
		}
		unmountUnder(dir)
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "dockerd.log")); err == nil {
				t.Logf("dockerd log:\n%s", b)
			}
		}
		os.RemoveAll(dir)
	})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.socket)
	}}, Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get("http://docker/_ping")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "dockerd.log"))
			t.Fatalf("dockerd exited: %s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dockerd not answering on %s: %v", d.socket, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return d
}

// absentDockerCgroups lists the "docker" parent cgroups dockerd will make
// (in the v2 and every v1 hierarchy) that do not exist yet.
func absentDockerCgroups() []string { return absentCgroups("docker") }

// absentCgroups lists name's directories at the top of every cgroup
// hierarchy that do not exist yet, to remove what a test made.
func absentCgroups(name string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") {
				p := filepath.Join(fields[4], name)
				if _, err := os.Stat(p); os.IsNotExist(err) {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// unmountUnder detaches any mount dockerd left below dir.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		syscall.Unmount(mounts[i], syscall.MNT_DETACH)
	}
}

func (d *dockerd) run(t *testing.T, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, d.cli, append([]string{"-H", "unix://" + d.socket}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

func (d *dockerd) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := d.run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// importImage builds the test image locally from busybox-static: no
// registry is reachable, none is needed.
func (d *dockerd) importImage(t *testing.T) {
	t.Helper()
	root := filepath.Join(d.dir, "rootfs")
	for _, dir := range []string{"bin", "www", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, _ := exec.LookPath("busybox")
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if isDynamic(bb) {
		t.Fatalf("%s is dynamically linked: the image needs busybox-static", bb)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "wget", "httpd", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "www", "index.html"), []byte("hello from web\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	imp := exec.Command("sh", "-c", `tar -C "$1" -cf - . | "$2" -H "unix://$3" import -c 'ENV PATH=/bin' - "$4"`, "sh", root, d.cli, d.socket, testImage)
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("docker import: %v: %s", err, out)
	}
}

func isDynamic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return true
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Containers on a user-defined bridge network are named with their
// container name, image, runtime and Compose workload: a client, a server,
// and a `docker run --rm` client that made one request and was gone,
// cgroup and all, before the drain.
func TestDockerContainersNamed(t *testing.T) {
	testnet.RequireRoot(t)
	d := startDockerd(t)
	d.importImage(t)
	d.must(t, "network", "create", "--driver", "bridge", "--subnet", dockerSubnet, "--gateway", dockerGateway,
		"-o", "com.docker.network.bridge.name=dtid"+fmt.Sprint(os.Getpid()%100000), "dtnet")

	cfg := identity.DefaultConfig()
	cfg.DockerSocket, cfg.PodmanSocket, cfg.ContainerdSocket, cfg.CRIOSocket = d.socket, "", "", ""
	res := startResolver(t, cfg)
	tr := startTracer(t)

	compose := func(svc string) []string {
		return []string{"--label", "com.docker.compose.project=shop", "--label", "com.docker.compose.service=" + svc}
	}
	run := func(args ...string) string { return d.must(t, append([]string{"run"}, args...)...) }
	run(append(append([]string{"-d", "--name", "web", "--network", "dtnet", "--ip", webIP}, compose("web")...),
		testImage, "httpd", "-f", "-p", "80", "-h", "/www")...)
	run(append(append([]string{"-d", "--name", "frontend", "--network", "dtnet", "--ip", frontendIP}, compose("frontend")...),
		testImage, "sh", "-c", "while true; do wget -q -O /dev/null http://"+webIP+"/; sleep 0.2; done")...)
	// One request, then gone: --rm removes the container and its cgroup
	// before `docker run` returns.
	for try := 0; ; try++ {
		_, err := d.run(t, append(append([]string{"run", "--rm", "--name", "oneshot", "--network", "dtnet"}, compose("oneshot")...),
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

package identity_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/dockertest"
	"github.com/deptrace/deptrace/internal/identity"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// podmanService is a `podman system service` of the test's own: storage,
// run state, events and network config in a temp dir, the cgroupfs
// manager (no systemd here), no networks (containers run with
// --network none, so no firewall or bridge changes).
type podmanService struct {
	dir, socket, bin string
}

// startPodman starts the service and, when the test ends, removes its
// containers, stops it and removes the temp dir, its mounts and the
// cgroups and run dirs podman made.
func startPodman(t *testing.T) *podmanService {
	t.Helper()
	bin := dockertest.Need(t, "podman", "podman")
	dir, err := os.MkdirTemp("", "dtpodman")
	if err != nil {
		t.Fatal(err)
	}
	p := &podmanService{dir: dir, socket: filepath.Join(dir, "podman.sock"), bin: bin}
	newCgroups := dockertest.AbsentCgroups("libpod_parent")
	// netavark's run dir, made even for --network none.
	_, runErr := os.Stat("/run/containers")
	conf := fmt.Sprintf(`[containers]
netns = "none"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %[1]q
tmp_dir = %[2]q
volume_path = %[3]q
static_dir = %[4]q
[network]
network_config_dir = %[5]q
`, filepath.Join(dir, "events.log"), filepath.Join(dir, "tmp"), filepath.Join(dir, "volumes"),
		filepath.Join(dir, "static"), filepath.Join(dir, "net"))
	storage := fmt.Sprintf("[storage]\ndriver = \"vfs\"\ngraphroot = %q\nrunroot = %q\n", filepath.Join(dir, "root"), filepath.Join(dir, "run"))
	for name, s := range map[string]string{"containers.conf": conf, "storage.conf": storage} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logf, err := os.Create(filepath.Join(dir, "service.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"),
		"--tmpdir", filepath.Join(dir, "tmp"), "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
		"--events-backend", "file", "system", "service", "--time=0", "unix://"+p.socket)
	cmd.Env = p.env()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatalf("podman system service: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // stopped on purpose below: its exit status says nothing
	t.Cleanup(func() {
		if ids, err := p.run("ps", "-aq"); err == nil && ids != "" {
			if out, err := p.run(append([]string{"rm", "-f", "-t", "0"}, strings.Fields(ids)...)...); err != nil {
				t.Errorf("remove containers: %v: %s", err, out)
			}
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logf.Close() // the service's log, for a failing test to read
		// conmon outlives its container a moment, and runs podman's
		// exit command (`podman container cleanup`, with this dir's
		// roots) when it goes: wait for both before removing anything.
		if left := waitNoProcessMentions(dir, 30*time.Second); len(left) > 0 {
			t.Errorf("podman processes still running 30 s after the service stopped: %v", left)
		}
		dockertest.UnmountUnder(dir)
		removeCgroupTrees(newCgroups)
		if os.IsNotExist(runErr) {
			_ = os.Remove("/run/containers/networks") // only if empty: best-effort cleanup
			_ = os.Remove("/run/containers")
		}
		if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), dir) {
			t.Errorf("mounts left under %s:\n%s", dir, b)
		}
		for _, c := range newCgroups {
			if _, err := os.Stat(c); err == nil {
				t.Errorf("cgroup %s left", c)
			}
		}
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "service.log")); err == nil {
				t.Logf("podman service log:\n%s", b)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	dockertest.WaitPing(t, "podman system service", p.socket, exited, filepath.Join(dir, "service.log"))
	return p
}

// waitNoProcessMentions waits (up to timeout) until no process has s in
// its command line, and returns those that still do.
func waitNoProcessMentions(s string, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		ents, _ := os.ReadDir("/proc") // always there on Linux
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == strconv.Itoa(os.Getpid()) {
				continue
			}
			b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err == nil && strings.Contains(string(b), s) {
				left = append(left, e.Name()+" "+strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " "))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// env keeps podman away from the host's configuration and state.
func (p *podmanService) env() []string {
	return append(os.Environ(), "CONTAINERS_CONF="+filepath.Join(p.dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(p.dir, "storage.conf"))
}

// run runs a podman client command against the service (a minute at
// most) and returns its trimmed output.
func (p *podmanService) run(args ...string) (string, error) {
	return p.runIn(nil, args...)
}

func (p *podmanService) runIn(stdin *os.File, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, append([]string{"--remote", "--url", "unix://" + p.socket}, args...)...)
	cmd.Env = p.env()
	if stdin != nil {
		cmd.Stdin = stdin
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

func (p *podmanService) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := p.run(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// importBusybox imports a busybox-static root as image.
func (p *podmanService) importBusybox(t *testing.T, image string) {
	t.Helper()
	dockertest.Need(t, "busybox", "busybox-static")
	root := filepath.Join(p.dir, "rootfs")
	makeBusyboxRoot(t, root)
	tarball := filepath.Join(p.dir, "rootfs.tar")
	if out, err := exec.Command("tar", "-C", root, "-cf", tarball, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if out, err := p.runIn(f, "import", "-c", "ENV PATH=/bin", "-", image); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// podmanCgroup returns a running container's main process's cgroup v2
// path and the id of that cgroup (its directory's inode), as the tracer
// records it.
func podmanCgroup(t *testing.T, p *podmanService, name string) (string, uint64) {
	t.Helper()
	pid, err := strconv.Atoi(p.must(t, "inspect", "-f", "{{.State.Pid}}", name))
	if err != nil || pid <= 0 {
		t.Fatalf("%s: pid %d: %v", name, pid, err)
	}
	path, ok := identity.PIDCgroupV2(pid)
	if !ok {
		t.Fatalf("%s: no cgroup v2 line in /proc/%d/cgroup", name, pid)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(cgroupRoot(t), path), &st); err != nil {
		t.Fatal(err)
	}
	return path, st.Ino
}

// A podman container is named from its cgroup through podman's
// Docker-compatible API: full id, name, image, runtime and Compose
// workload; and one removed (cgroup and all) after a second of life is
// still named.
func TestPodmanContainersNamed(t *testing.T) {
	testnet.RequireRoot(t)
	p := startPodman(t)
	const image = "deptrace-test/busybox:1"
	p.importBusybox(t, image)

	cfg := identity.DefaultConfig()
	cfg.DockerSocket, cfg.PodmanSocket, cfg.ContainerdSocket, cfg.CRIOSocket = "", p.socket, "", ""
	res := startResolver(t, cfg)

	// podman raises the containers' nofile and nproc limits by default,
	// which needs CAP_SYS_RESOURCE; lower ones need nothing.
	run := func(name, svc string) string {
		return p.must(t, "run", "-d", "--name", name, "--network", "none",
			"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
			"--label", "com.docker.compose.project=shop", "--label", "com.docker.compose.service="+svc,
			image, "sleep", "300")
	}
	// podman names a local image localhost/<name>.
	want := func(id, name, svc string) tracer.Identity {
		return tracer.Identity{ContainerID: id, ContainerName: name, ContainerImage: "localhost/" + image,
			ContainerRuntime: identity.RuntimePodman, Workload: "compose/shop/" + svc}
	}
	resolve := func(cgid uint64, w tracer.Identity) tracer.Identity {
		// Bounded: the resolver learns the cgroup and the container
		// from inotify and the event stream, within a second or so.
		var got tracer.Identity
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if got = res.Resolve(cgid); got == w {
				break
			}
		}
		return got
	}

	id := run("dtpod-web", "web")
	if !hex64.MatchString(id) {
		t.Fatalf("podman run printed %q, not a full container id", id)
	}
	path, cgid := podmanCgroup(t, p, "dtpod-web")
	t.Logf("podman container cgroup: %s (id %d)", path, cgid)
	if got := identity.ParsePath(path); got.Runtime != identity.RuntimePodman || got.ContainerID != id {
		t.Errorf("ParsePath(%q) = %+v", path, got)
	}
	if got := resolve(cgid, want(id, "dtpod-web", "web")); got != want(id, "dtpod-web", "web") {
		t.Errorf("running container\n got %+v\nwant %+v", got, want(id, "dtpod-web", "web"))
	}

	// A container that lived a second, removed before anyone asked.
	gone := run("dtpod-oneshot", "oneshot")
	gonePath, goneID := podmanCgroup(t, p, "dtpod-oneshot")
	time.Sleep(time.Second)
	p.must(t, "rm", "-f", "-t", "0", "dtpod-oneshot")
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(cgroupRoot(t), gonePath)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cgroup %s still there 15 s after podman rm", gonePath)
		}
	}
	if got := resolve(goneID, want(gone, "dtpod-oneshot", "oneshot")); got != want(gone, "dtpod-oneshot", "oneshot") {
		t.Errorf("removed container\n got %+v\nwant %+v", got, want(gone, "dtpod-oneshot", "oneshot"))
	}
}

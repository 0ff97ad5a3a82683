// Package dockertest starts a Docker daemon of a privileged test's own and
// builds test images locally, leaving the machine as it found it.
//
// Starting dockerd as usual breaks every other network-namespace test on the
// machine: it sets the iptables FORWARD policy to DROP and turns on bridge
// netfilter, which silences plain Linux bridges. The daemon here keeps its
// data, state and socket in a temp dir, creates no default bridge and
// changes no iptables rules, forwarding or masquerading; whatever it changed
// anyway (bridge netfilter, loaded with the first bridge network) is put
// back when the test ends, with its containers, networks, mounts and
// cgroups. No registry is reachable or needed: images are imported from a
// busybox-static root or loaded from a tarball.
package dockertest

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
)

// Need finds a program the test needs: a skip on a laptop, a failure under
// CI=true (CI must never pass by skipping).
func Need(t testing.TB, prog, pkg string) string {
	t.Helper()
	if p, err := exec.LookPath(prog); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		if _, err := os.Stat(filepath.Join(dir, prog)); err == nil {
			return filepath.Join(dir, prog)
		}
	}
	if testnet.UnderCI() {
		t.Fatalf("%s not installed (Debian package %s; scripts/deps.sh installs it)", prog, pkg)
	}
	t.Skipf("%s not installed (apt-get install %s)", prog, pkg)
	return ""
}

// hostState is what dockerd may change and other tests depend on.
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

func saveHostState() hostState {
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

func (s hostState) restore(t testing.TB) {
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
		if out, err := exec.Command("iptables", "-S", "FORWARD").Output(); err == nil && strings.HasPrefix(string(out), "-P FORWARD "+s.forwardPolicy+"\n") {
			return
		}
		if out, err := exec.Command("iptables", "-P", "FORWARD", s.forwardPolicy).CombinedOutput(); err != nil {
			t.Errorf("restore FORWARD policy %s: %v: %s", s.forwardPolicy, err, out)
		}
	}
}

// Daemon is a dockerd of the test's own.
type Daemon struct {
	Dir    string // temp dir holding its data-root, exec-root, socket and log
	Socket string // its API socket (unix)
	CLI    string // the docker client matching it
}

// Start starts a dockerd and stops it, with everything it made, when the
// test ends (after the test's own later cleanups).
func Start(t testing.TB) *Daemon {
	t.Helper()
	bin := Need(t, "dockerd", "docker.io")
	cli := "/usr/bin/docker" // Debian's client, matching its daemon's API
	if _, err := os.Stat(cli); err != nil {
		cli = Need(t, "docker", "docker.io")
	}
	dir, err := os.MkdirTemp("", "dtdocker")
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{Dir: dir, Socket: filepath.Join(dir, "docker.sock"), CLI: cli}
	state := saveHostState()
	newCgroups := AbsentCgroups("docker")
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "docker.pid"), "--config-file", filepath.Join(dir, "daemon.json"),
		"-H", "unix://"+d.Socket, "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
		"--bridge=none", "--userland-proxy=false", "--exec-opt", "native.cgroupdriver=cgroupfs", "--log-level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // killed on purpose below: its exit status says nothing
	t.Cleanup(func() {
		// Containers first, then networks, then the daemon, then what it
		// may have left; images go with the data-root.
		if ids, err := d.Run("ps", "-aq"); err == nil && ids != "" {
			_, _ = d.Run(append([]string{"rm", "-f"}, strings.Fields(ids)...)...)
		}
		_, _ = d.Run("network", "prune", "-f") // best-effort cleanup
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		_ = logf.Close() // the daemon's log, for a failing test to read
		state.restore(t)
		for _, p := range newCgroups {
			_ = os.Remove(p) // the daemon's parent cgroup, empty now; best-effort cleanup
		}
		UnmountUnder(dir)
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "dockerd.log")); err == nil {
				t.Logf("dockerd log:\n%s", b)
			}
		}
		_ = os.RemoveAll(dir) // best-effort cleanup of a temp dir
	})
	WaitPing(t, "dockerd", d.Socket, exited, filepath.Join(dir, "dockerd.log"))
	return d
}

// WaitPing waits up to 60 s until the Engine API on socket (dockerd's, or
// podman's compatible one) answers /_ping with 200; it fails the test,
// with the daemon's log, if the daemon exits first or never answers.
func WaitPing(t testing.TB, what, socket string, exited <-chan struct{}, logPath string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", socket)
	}}, Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get("http://engine/_ping")
		if err == nil {
			_ = resp.Body.Close() // only the status is read
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("%s exited: %s", what, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not answering on %s: %v", what, socket, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Command is a docker client command against this daemon.
func (d *Daemon) Command(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, d.CLI, append([]string{"-H", "unix://" + d.Socket}, args...)...)
}

// Run runs a docker client command (a minute at most) and returns its
// trimmed output.
func (d *Daemon) Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := d.Command(ctx, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// Must is Run, failing the test on an error.
func (d *Daemon) Must(t testing.TB, args ...string) string {
	t.Helper()
	out, err := d.Run(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Logs returns a container's standard output and standard error apart.
func (d *Daemon) Logs(t testing.TB, name string) (stdout, stderr []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var o, e bytes.Buffer
	cmd := d.Command(ctx, "logs", name)
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		t.Fatalf("docker logs %s: %v: %s", name, err, e.Bytes())
	}
	return o.Bytes(), e.Bytes()
}

// ImportBusybox imports image (e.g. deptrace-test/busybox:1): the static
// busybox with the applets sh, wget, httpd, nc, nslookup, seq and sleep in
// /bin, and
// /www/index.html for httpd.
func (d *Daemon) ImportBusybox(t testing.TB, image string) {
	t.Helper()
	bb := Need(t, "busybox", "busybox-static")
	root := filepath.Join(d.Dir, "rootfs-"+strings.NewReplacer("/", "_", ":", "_").Replace(image))
	for _, dir := range []string{"bin", "www", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if IsDynamic(bb) {
		t.Fatalf("%s is dynamically linked: the image needs busybox-static", bb)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "wget", "httpd", "nc", "nslookup", "seq", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "www", "index.html"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	imp := exec.Command("sh", "-c", `tar -C "$1" -cf - . | "$2" -H "unix://$3" import -c 'ENV PATH=/bin' - "$4"`, "sh", root, d.CLI, d.Socket, image)
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("docker import: %v: %s", err, out)
	}
}

// IsDynamic tells whether the executable at path needs a dynamic loader.
func IsDynamic(path string) bool {
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

// AbsentCgroups lists name's directories at the top of every cgroup
// hierarchy that do not exist yet, to remove what the daemon made.
func AbsentCgroups(name string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }() // read-only
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

// UnmountUnder detaches any mount the daemon left below dir.
func UnmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }() // read-only
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		_ = syscall.Unmount(mounts[i], syscall.MNT_DETACH) // best-effort cleanup
	}
}

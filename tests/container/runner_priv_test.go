package container_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/dockertest"
)

// containerd is the ctr client on the test dockerd's own containerd, in a
// namespace of the test's own (Docker's containers live in "moby").
type containerd struct {
	bin, socket, namespace string
}

func (c *containerd) command(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, c.bin, append([]string{"-a", c.socket, "-n", c.namespace}, args...)...)
}

func (c *containerd) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := c.command(ctx, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// importIntoContainerd imports the tarball with `ctr images import` and
// finds it under the name its index gives.
func importIntoContainerd(t *testing.T, d *dockertest.Daemon, tarball, ref string) *containerd {
	t.Helper()
	c := &containerd{bin: dockertest.Need(t, "ctr", "containerd"),
		socket: filepath.Join(d.Dir, "exec", "containerd", "containerd.sock"), namespace: "deptrace-test"}
	if _, err := os.Stat(c.socket); err != nil {
		t.Fatalf("dockerd's containerd socket: %v", err)
	}
	if _, err := c.run("images", "import", tarball); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.run("images", "rm", "docker.io/"+ref) })
	out, err := c.run("images", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	if names := strings.Fields(out); !slices.Contains(names, "docker.io/"+ref) {
		t.Fatalf("ctr images ls: %v, want docker.io/%s", names, ref)
	}
	return c
}

// agent is deptrace running in its container.
type agent struct {
	state string // the host directory mounted at /var/lib/deptrace
	wait  func() (stdout, stderr []byte, err error)
	stop  func() // SIGTERM
}

// agentRun is what to run: the container's name, the line deptrace logs
// once it is tracing, and deptrace's arguments.
type agentRun struct {
	id, ready string
	args      []string
}

// dockerDefaultCaps are the capabilities containerd (like Docker) grants a
// container by default: all but CAP_DAC_OVERRIDE are dropped.
var dockerDefaultCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}

// startAgent runs deptrace from the image as docs/operations.md says: the
// host's PID and network namespaces, exactly the systemd unit's
// capabilities, the runtime's default seccomp profile, a read-only root,
// bpffs, BTF and the cgroup tree mounted, the Docker socket read-only and
// a state directory. It returns once deptrace logs that it is tracing.
//
// It runs under Docker when the daemon can grant the unit's capabilities.
// Docker 20.10 (Debian 12's docker.io, the one here) refuses CAP_BPF and
// CAP_PERFMON as unknown, and its --privileged fails on a machine whose
// root lacks a capability (here CAP_SYS_RESOURCE): there the same
// container runs in the daemon's own containerd through ctr, as a
// Kubernetes node's runtime would run the DaemonSet's pod.
func startAgent(t *testing.T, d *dockertest.Daemon, c *containerd, ref string, r agentRun) *agent {
	t.Helper()
	caps := unitCaps(t)
	state, lock := t.TempDir(), t.TempDir()
	dockerArgs := []string{"--cap-drop=ALL"}
	for _, cp := range caps {
		dockerArgs = append(dockerArgs, "--cap-add="+cp)
	}
	out, err := d.Run(append(append([]string{"run", "--rm"}, dockerArgs...), busybox, "true")...)
	if err == nil {
		a := startDockerAgent(t, d, append(dockerArgs, "-v", state+":/var/lib/deptrace", "-v", lock+":/run/deptrace"), ref, r)
		a.state = state
		return a
	}
	if !strings.Contains(out, "unknown capability") {
		t.Fatal(err)
	}
	t.Logf("this dockerd cannot grant the unit's capabilities (%s): running the image in its containerd",
		strings.TrimSpace(strings.SplitN(out, "\n", 2)[0]))
	a := startContainerdAgent(t, d, c, caps, []string{
		"src=" + state + ",dst=/var/lib/deptrace,options=rbind:rw",
		"src=" + lock + ",dst=/run/deptrace,options=rbind:rw",
	}, ref, r)
	a.state = state
	return a
}

func startDockerAgent(t *testing.T, d *dockertest.Daemon, extra []string, ref string, r agentRun) *agent {
	t.Helper()
	id := r.id
	run := append([]string{"run", "-d", "--name", id, "--pid=host", "--network=host", "--cgroupns=host", "--read-only"}, extra...)
	run = append(run,
		"-v", "/sys/fs/bpf:/sys/fs/bpf",
		"-v", "/sys/kernel/btf:/sys/kernel/btf:ro",
		"-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro",
		"-v", d.Socket+":/var/run/docker.sock:ro", ref)
	d.Must(t, append(run, r.args...)...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, stderr := d.Logs(t, id)
		if bytes.Contains(stderr, []byte(r.ready)) {
			break
		}
		if st, _ := d.Run("inspect", "--format", "{{.State.Status}}", id); st != "running" || time.Now().After(deadline) {
			t.Fatalf("deptrace (%s) never started tracing:\n%s", st, stderr)
		}
		time.Sleep(300 * time.Millisecond)
	}
	return &agent{wait: func() ([]byte, []byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		out, err := d.Command(ctx, "wait", id).CombinedOutput()
		stdout, stderr := d.Logs(t, id)
		if err == nil && strings.TrimSpace(string(out)) != "0" {
			err = fmt.Errorf("exit status %s", strings.TrimSpace(string(out)))
		}
		return stdout, stderr, err
	}, stop: func() { _, _ = d.Run("kill", "--signal", "SIGTERM", id) }}
}

// lineWatch is a process's standard error, kept whole and watched for a
// line.
type lineWatch struct {
	mu   sync.Mutex
	all  bytes.Buffer
	seen chan struct{}
	once sync.Once
	done chan struct{}
}

func watchLines(r io.Reader, want string) *lineWatch {
	w := &lineWatch{seen: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		s := bufio.NewScanner(r)
		for s.Scan() {
			w.mu.Lock()
			w.all.Write(s.Bytes())
			w.all.WriteByte('\n')
			w.mu.Unlock()
			if strings.Contains(s.Text(), want) {
				w.once.Do(func() { close(w.seen) })
			}
		}
	}()
	return w
}

func (w *lineWatch) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.all.Bytes())
}

func startContainerdAgent(t *testing.T, d *dockertest.Daemon, c *containerd, caps, mounts []string, ref string, r agentRun) *agent {
	t.Helper()
	id := r.id
	newCgroups := dockertest.AbsentCgroups(c.namespace)
	// The host's PID namespace, named by this process's (pid 1 may be
	// unreadable, as on this machine; ctr has no "host" option).
	run := []string{"run", "--net-host", "--with-ns", fmt.Sprintf("pid:/proc/%d/ns/pid", os.Getpid()), "--read-only", "--seccomp"}
	for _, cp := range dockerDefaultCaps {
		if !slices.Contains(caps, cp) {
			run = append(run, "--cap-drop", cp)
		}
	}
	for _, cp := range caps {
		run = append(run, "--cap-add", cp)
	}
	for _, m := range []string{
		"src=/sys/fs/bpf,dst=/sys/fs/bpf,options=rbind:rw",
		"src=/sys/kernel/btf,dst=/sys/kernel/btf,options=rbind:ro",
		"src=/sys/fs/cgroup,dst=/sys/fs/cgroup,options=rbind:ro",
		"src=" + d.Socket + ",dst=/var/run/docker.sock,options=bind:ro",
	} {
		run = append(run, "--mount", "type=bind,"+m)
	}
	for _, m := range mounts {
		run = append(run, "--mount", "type=bind,"+m)
	}
	// ctr replaces the image's entrypoint with the arguments.
	run = append(append(run, "docker.io/"+ref, id, "/usr/bin/deptrace"), r.args...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	cmd := c.command(ctx, run...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stderr := watchLines(errPipe, r.ready)
	exited := make(chan error, 1)
	go func() {
		<-stderr.done
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_, _ = c.run("tasks", "kill", "-s", "SIGKILL", id)
		select {
		case <-exited: //nolint:errcheck // killed on purpose: its exit error is the kill
		case <-time.After(30 * time.Second):
		}
		cancel()
		_, _ = c.run("tasks", "rm", "-f", id)
		_, _ = c.run("containers", "rm", id)
		for _, p := range newCgroups {
			os.Remove(p)
		}
	})
	select {
	case <-stderr.seen:
	case err := <-exited:
		t.Fatalf("ctr run exited (%v) before tracing:\n%s", err, stderr.bytes())
	case <-time.After(60 * time.Second):
		t.Fatalf("deptrace never started tracing:\n%s", stderr.bytes())
	}
	return &agent{wait: func() ([]byte, []byte, error) {
		select {
		case err := <-exited:
			return stdout.Bytes(), stderr.bytes(), err
		case <-time.After(2 * time.Minute):
			return stdout.Bytes(), stderr.bytes(), fmt.Errorf("still running")
		}
	}, stop: func() { _, _ = c.run("tasks", "kill", "-s", "SIGTERM", id) }}
}

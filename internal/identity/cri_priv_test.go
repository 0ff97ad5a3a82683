package identity_test

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/deptrace/deptrace/internal/dockertest"
	"github.com/deptrace/deptrace/internal/identity"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// containerd is a daemon of the test's own with its CRI plugin: root,
// state and sockets in a temp dir, a locally built pause image, and pods
// on the host network so no CNI is needed.
type containerd struct {
	dir, socket string
}

const (
	pauseImage   = "docker.io/deptrace-test/pause:1"
	criTestImage = "docker.io/deptrace-test/busybox:1"
)

func startContainerd(t *testing.T) *containerd {
	t.Helper()
	bin := dockertest.Need(t, "containerd", "containerd")
	ctr := dockertest.Need(t, "ctr", "containerd")
	dockertest.Need(t, "containerd-shim-runc-v2", "containerd")
	dockertest.Need(t, "runc", "runc")
	dockertest.Need(t, "busybox", "busybox-static")
	dir, err := os.MkdirTemp("", "dtcd")
	if err != nil {
		t.Fatal(err)
	}
	c := &containerd{dir: dir, socket: filepath.Join(dir, "containerd.sock")}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  level = "warn"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  disable_apparmor = true
  # The sandbox asks for oom_score_adj -998; lowering it needs
  # CAP_SYS_RESOURCE, which this project's machines do not grant.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.socket, c.socket+".ttrpc", pauseImage,
		filepath.Join(dir, "cni-bin"), filepath.Join(dir, "cni-conf"), filepath.Join(dir, "opt"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		dockertest.UnmountUnder(dir)
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "containerd.log")); err == nil {
				t.Logf("containerd log:\n%s", b)
			}
		}
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(c.socket); err == nil {
			if out, err := exec.Command(ctr, "--address", c.socket, "version").CombinedOutput(); err == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("containerd not answering: %v: %s", err, out)
			}
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
			t.Fatalf("containerd exited: %s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd socket never appeared")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Both images are busybox-static roots: the pause container sleeps.
	root := filepath.Join(dir, "rootfs")
	makeBusyboxRoot(t, root)
	for _, img := range []struct {
		name string
		cmd  []string
	}{{pauseImage, []string{"/bin/busybox", "sleep", "2147483647"}}, {criTestImage, []string{"/bin/sh"}}} {
		archive := filepath.Join(dir, "image.tar")
		writeDockerArchive(t, archive, root, img.name, img.cmd)
		if out, err := exec.Command(ctr, "--address", c.socket, "-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
			t.Fatalf("ctr images import %s: %v: %s", img.name, err, out)
		}
	}
	return c
}

func makeBusyboxRoot(t *testing.T, root string) {
	t.Helper()
	for _, dir := range []string{"bin", "tmp", "etc", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, _ := exec.LookPath("busybox")
	if dockertest.IsDynamic(bb) {
		t.Fatalf("%s is dynamically linked: the image needs busybox-static", bb)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "wget", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
}

// writeDockerArchive writes root as a one-layer image in the format of
// `docker save`, which `ctr images import` reads.
func writeDockerArchive(t *testing.T, path, root, name string, cmd []string) {
	t.Helper()
	// The layer first, to know its digest.
	layerPath := path + ".layer"
	lf, err := os.Create(layerPath)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(lf, h))
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = strings.TrimPrefix(p, root+"/")
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	lf.Close()
	if err != nil {
		t.Fatal(err)
	}
	diffID := "sha256:" + hex.EncodeToString(h.Sum(nil))
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Env": []string{"PATH=/bin"}, "Cmd": cmd},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	manifest, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{name}, "Layers": []string{"layer.tar"}}})
	layer, err := os.ReadFile(layerPath)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(layerPath)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	aw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		b    []byte
	}{{"layer.tar", layer}, {"config.json", config}, {"manifest.json", manifest}} {
		if err := aw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := aw.Write(e.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := aw.Close(); err != nil {
		t.Fatal(err)
	}
}

// A pod run through the CRI API the way kubelet runs one (sandbox and
// container with kubelet's labels, a Deployment's pod-template-hash) is
// named with its namespace, pod, uid, container and workload; so is a
// container of it that made one request and was removed before the drain.
func TestContainerdCRIPodNamed(t *testing.T) {
	testnet.RequireRoot(t)
	cd := startContainerd(t)

	cfg := identity.DefaultConfig()
	cfg.DockerSocket, cfg.PodmanSocket, cfg.ContainerdSocket, cfg.CRIOSocket = "", "", cd.socket, ""
	res := startResolver(t, cfg)
	tr := startTracer(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })}
	go func() { _ = srv.Serve(ln) }() // ends with ErrServerClosed at cleanup
	defer srv.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)

	conn, err := grpc.NewClient("unix://"+cd.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const (
		ns, pod, uid = "shop", "checkout-7d4b9c6f5-x2x4k", "0f6b1c52-7e36-4a8e-9b1f-3c2d1e0f9a8b"
	)
	podLabels := map[string]string{
		"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.uid": uid,
		"app": "checkout", "pod-template-hash": "7d4b9c6f5",
	}
	// kubelet's cgroupfs layout: /kubepods/<qos>/pod<uid>/<container id>.
	parent := "/kubepods/besteffort/pod" + uid
	sbConfig := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod, Namespace: ns, Uid: uid},
		Labels:   podLabels,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: parent,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
			},
		},
	}
	newCgroups := dockertest.AbsentCgroups("kubepods")
	t.Cleanup(func() { removeCgroupTrees(newCgroups) }) // runs after containerd stopped
	sb, err := rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbConfig})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	// Deferred, not a Cleanup: it needs conn, closed when the test returns.
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			t.Errorf("StopPodSandbox: %v", err)
		}
		if _, err := rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			t.Errorf("RemovePodSandbox: %v", err)
		}
	}()
	ct, err := rs.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  sb.PodSandboxId,
		SandboxConfig: sbConfig,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
			Image:    &runtimeapi.ImageSpec{Image: criTestImage},
			Command:  []string{"/bin/sh", "-c", fmt.Sprintf("while true; do wget -q -O /dev/null http://127.0.0.1:%d/; sleep 0.2; done", port)},
			Labels: map[string]string{
				"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.uid": uid,
				"io.kubernetes.container.name": "app",
			},
			Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE, Pid: runtimeapi.NamespaceMode_CONTAINER},
			}},
		},
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := rs.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ct.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}

	var got *tracer.Flow
	deadline := time.Now().Add(20 * time.Second)
	for got == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no flow to port %d from the pod's container", port)
		}
		time.Sleep(300 * time.Millisecond)
		iv, err := tr.Collect()
		if err != nil {
			t.Fatal(err)
		}
		res.Annotate(iv.Flows)
		for i := range iv.Flows {
			f := &iv.Flows[i]
			if f.Proto == tracer.ProtoTCP && f.Direction == tracer.Outbound && f.Port == port && f.ContainerID != "" {
				got = f
			}
		}
	}
	want := tracer.Identity{ContainerID: ct.ContainerId, ContainerName: "app", ContainerImage: criTestImage, ContainerRuntime: identity.RuntimeContainerd,
		PodNamespace: ns, PodName: pod, PodUID: uid, K8sContainer: "app", Workload: "Deployment/checkout"}
	if got.Identity != want {
		t.Errorf("pod's flow identity\n got %+v\nwant %+v", got.Identity, want)
	}

	// A container that makes one request and is removed, cgroup and CRI
	// record, before the drain: named from what was learnt when its
	// cgroup was made. Its own server port keeps its flow apart from
	// app's (both are on the host network).
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv2 := &http.Server{Handler: srv.Handler}
	go func() { _ = srv2.Serve(ln2) }() // ends with ErrServerClosed at cleanup
	defer srv2.Close()
	port2 := uint16(ln2.Addr().(*net.TCPAddr).Port)
	once, err := rs.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  sb.PodSandboxId,
		SandboxConfig: sbConfig,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "oneshot"},
			Image:    &runtimeapi.ImageSpec{Image: criTestImage},
			Command:  []string{"/bin/wget", "-q", "-O", "/dev/null", fmt.Sprintf("http://127.0.0.1:%d/", port2)},
			Labels: map[string]string{
				"io.kubernetes.pod.name": pod, "io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.uid": uid,
				"io.kubernetes.container.name": "oneshot",
			},
			Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE, Pid: runtimeapi.NamespaceMode_CONTAINER},
			}},
		},
	})
	if err != nil {
		t.Fatalf("CreateContainer oneshot: %v", err)
	}
	if _, err := rs.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: once.ContainerId}); err != nil {
		t.Fatalf("StartContainer oneshot: %v", err)
	}
	for {
		st, err := rs.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: once.ContainerId})
		if err != nil {
			t.Fatal(err)
		}
		if st.Status.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			if st.Status.ExitCode != 0 {
				t.Fatalf("oneshot exited %d: %s", st.Status.ExitCode, st.Status.Message)
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := rs.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: once.ContainerId}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot(t), parent, once.ContainerId)); !os.IsNotExist(err) {
		t.Fatalf("oneshot's cgroup still there after RemoveContainer (%v): the test would not test a gone container", err)
	}
	got = nil
	deadline = time.Now().Add(10 * time.Second)
	for got == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no flow to port %d from the oneshot container", port2)
		}
		iv, err := tr.Collect()
		if err != nil {
			t.Fatal(err)
		}
		res.Annotate(iv.Flows)
		for i := range iv.Flows {
			if f := &iv.Flows[i]; f.Proto == tracer.ProtoTCP && f.Direction == tracer.Outbound && f.Port == port2 {
				got = f
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	want.ContainerID, want.ContainerName, want.K8sContainer = once.ContainerId, "oneshot", "oneshot"
	if got.Identity != want {
		t.Errorf("oneshot's flow identity\n got %+v\nwant %+v", got.Identity, want)
	}
}

func cgroupRoot(t *testing.T) string {
	t.Helper()
	root, err := kernel.CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// removeCgroupTrees removes the (empty) cgroup trees, deepest first.
func removeCgroupTrees(roots []string) {
	for _, r := range roots {
		var dirs []string
		_ = filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			os.Remove(dirs[i])
		}
	}
}

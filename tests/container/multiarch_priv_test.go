package container_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/dockertest"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/packaging/ociimage"
)

// The multi-architecture tarball `make release` writes
// (deptrace_VERSION_multiarch.oci.tar: mkimage -platform amd64=...
// -platform arm64=...) loads into Debian's Docker (dockerd 20.10, which
// reads the tarball's Docker manifest.json, not its OCI index): docker load
// tags each architecture's image NAME:TAG-ARCH with that architecture, and
// the host's (amd64) one runs. Under CI=true a Docker that cannot start
// fails the test (dockertest).
func TestMultiArchTarballLoadsIntoDocker(t *testing.T) {
	testnet.RequireRoot(t)
	mk := dockertest.Need(t, "make", "make")
	goBin := dockertest.Need(t, "go", "golang-go")
	hostArch := goarch(t, goBin)
	if hostArch != "amd64" && hostArch != "arm64" {
		t.Fatalf("host GOARCH %s: the image is built for amd64 and arm64 only", hostArch)
	}
	d := dockertest.Start(t)

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// make release's steps for the image: make build per architecture,
	// then mkimage with one -platform each.
	args := []string{}
	for _, arch := range []string{"amd64", "arm64"} {
		bin := filepath.Join(dir, "linux_"+arch, "deptrace")
		build := exec.CommandContext(ctx, mk, "-C", repoRoot, "--no-print-directory", "build", "GOARCH="+arch, "BIN="+bin, "VERSION="+imageVersion)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("make build GOARCH=%s: %v\n%s", arch, err, out)
		}
		args = append(args, "-platform", arch+"="+bin)
	}
	tarball := filepath.Join(dir, "deptrace_multiarch.oci.tar")
	mkimage := exec.CommandContext(ctx, goBin, append(append([]string{"run", "./packaging/mkimage"}, args...),
		"-version", imageVersion, "-created", "0", "-out", tarball)...)
	mkimage.Dir = repoRoot
	mkimage.Env = append(os.Environ(), "GOOS=", "GOARCH=")
	if out, err := mkimage.CombinedOutput(); err != nil {
		t.Fatalf("mkimage: %v\n%s", err, out)
	}

	if v := d.Must(t, "version", "--format", "{{.Server.Version}}"); !strings.HasPrefix(v, "20.10.") {
		t.Logf("dockerd %s (Debian 12's is 20.10)", v)
	}
	out := d.Must(t, "load", "-i", tarball)
	img := ociimage.Image{Name: "deptrace/deptrace", Version: imageVersion}
	for _, arch := range []string{"amd64", "arm64"} {
		img.Arch = arch
		if !strings.Contains(out, "Loaded image: "+img.ArchRef()) {
			t.Errorf("docker load -i %s did not load %s:\n%s", filepath.Base(tarball), img.ArchRef(), out)
			continue
		}
		got := d.Must(t, "image", "inspect", "--format", "{{.Os}}/{{.Architecture}} {{json .Config.Entrypoint}} {{index .Config.Labels \"org.opencontainers.image.version\"}}", img.ArchRef())
		if want := "linux/" + arch + ` ["/usr/bin/deptrace"] ` + imageVersion; got != want {
			t.Errorf("docker image inspect %s: %q, want %q", img.ArchRef(), got, want)
		}
	}
	// The host's architecture runs: deptrace --version from its image.
	img.Arch = hostArch
	if got := d.Must(t, "run", "--rm", "--network", "none", img.ArchRef(), "--version"); !strings.Contains(got, imageVersion) {
		t.Errorf("docker run %s --version: %q, want the version %s", img.ArchRef(), got, imageVersion)
	}
}

// Command mkimage writes deptrace's OCI image tarball from the static binary
// `make build` produced: `make image` runs it. The tarball is both an OCI
// image layout and a Docker image archive, so `docker load -i` and
// `ctr images import` both take it; building it needs no daemon, registry or
// network. See docs/operations.md, "Run as a container".
//
// With -platform ARCH=BINARY, once per architecture (make release), it
// writes one multi-architecture image instead (ociimage.WriteIndex).
package main

import (
	"bytes"
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/deptrace/deptrace/packaging/ociimage"
)

func main() {
	var (
		img     ociimage.Image
		binary  = flag.String("binary", "deptrace", "the static deptrace binary")
		out     = flag.String("out", "", "the image tarball to write (required)")
		created = flag.String("created", "", "image creation time, Unix seconds (the commit's time; default SOURCE_DATE_EPOCH, else 0)")
	)
	flag.StringVar(&img.Name, "name", "deptrace/deptrace", "image repository")
	flag.StringVar(&img.Version, "version", "", "version (org.opencontainers.image.version; the tag is made from it)")
	flag.StringVar(&img.Arch, "arch", "", "GOARCH of the binary (the image's architecture)")
	flag.StringVar(&img.Revision, "revision", "", "source commit (org.opencontainers.image.revision)")
	flag.StringVar(&img.Source, "source", "https://github.com/deptrace/deptrace", "source repository (org.opencontainers.image.source)")
	var platforms []string
	flag.Func("platform", "ARCH=BINARY: one architecture of a multi-architecture image (repeat; replaces -binary and -arch)", func(v string) error {
		platforms = append(platforms, v)
		return nil
	})
	flag.Parse()
	if err := run(&img, *binary, *out, *created, platforms); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// elfMachine is the ELF machine of each GOARCH an image is made for.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// readBinary reads a static Linux executable for arch.
func readBinary(binary, arch string) ([]byte, error) {
	b, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	// FROM scratch: a dynamically linked binary would find no loader.
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: not an ELF executable: %w", binary, err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("%s is dynamically linked: build it with CGO_ENABLED=0 (make build)", binary)
		}
	}
	if m, ok := elfMachine[arch]; ok && f.Machine != m {
		return nil, fmt.Errorf("%s is a %s executable, not one for %s (%s): build it with GOARCH=%s", binary, f.Machine, arch, m, arch)
	}
	return b, nil
}

func run(img *ociimage.Image, binary, out, created string, platforms []string) error {
	if out == "" || img.Version == "" || (img.Arch == "" && len(platforms) == 0) {
		return fmt.Errorf("-out, -version and -arch (or -platform) are required")
	}
	if created == "" {
		created = os.Getenv("SOURCE_DATE_EPOCH")
	}
	if created != "" {
		sec, err := strconv.ParseInt(created, 10, 64)
		if err != nil {
			return fmt.Errorf("invalid -created %q: Unix seconds expected", created)
		}
		img.Created = time.Unix(sec, 0)
	} else {
		img.Created = time.Unix(0, 0)
	}
	var imgs []ociimage.Image
	for _, p := range platforms {
		arch, bin, ok := strings.Cut(p, "=")
		if !ok || arch == "" || bin == "" {
			return fmt.Errorf("-platform %q: ARCH=BINARY expected", p)
		}
		b, err := readBinary(bin, arch)
		if err != nil {
			return err
		}
		one := *img
		one.Arch, one.Binary = arch, b
		imgs = append(imgs, one)
	}
	if len(imgs) == 0 {
		b, err := readBinary(binary, img.Arch)
		if err != nil {
			return err
		}
		img.Binary = b
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".image-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // a temp file
	write := func() error { return ociimage.Write(tmp, *img) }
	what := img.Ref()
	if len(imgs) > 0 {
		write = func() error { return ociimage.WriteIndex(tmp, imgs) }
		what = img.Ref() + ", " + strconv.Itoa(len(imgs)) + " platforms"
	}
	if err := write(); err != nil {
		_ = tmp.Close() // the write's error is the one to report
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	st, _ := os.Stat(out)
	fmt.Printf("image: %s (%s, %.1f MB)\n", out, what, float64(st.Size())/1e6)
	return nil
}

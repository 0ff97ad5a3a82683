package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"slices"
	"testing"
	"time"
)

func testImage() Image {
	return Image{
		Binary: []byte("\x7fELF not really"), Name: "deptrace/deptrace", Version: "0.0.0~git1a2b3c4", Arch: "amd64",
		Revision: "1a2b3c4d", Source: "https://github.com/deptrace/deptrace", Created: time.Unix(1700000000, 0),
	}
}

func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			c, _ := io.ReadAll(tr)
			files[h.Name] = c
		}
	}
}

func blob(t *testing.T, files map[string][]byte, d Descriptor) []byte {
	t.Helper()
	b, ok := files[blobPath(d.Digest)]
	if !ok {
		t.Fatalf("blob %s missing", d.Digest)
	}
	if digest(b) != d.Digest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: digest %s, %d bytes, descriptor says %d", d.Digest, digest(b), len(b), d.Size)
	}
	return b
}

// The tarball is a valid OCI layout and a Docker archive of the same
// blobs, every digest checks, and the binary is the entrypoint.
func TestWriteLayoutAndDockerArchive(t *testing.T) {
	img := testImage()
	var buf bytes.Buffer
	if err := Write(&buf, img); err != nil {
		t.Fatal(err)
	}
	files := untar(t, buf.Bytes())
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout: %s", files["oci-layout"])
	}
	var idx Index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if idx.SchemaVersion != 2 || len(idx.Manifests) != 1 {
		t.Fatalf("index: %+v", idx)
	}
	md := idx.Manifests[0]
	if md.Annotations["io.containerd.image.name"] != "docker.io/deptrace/deptrace:0.0.0-git1a2b3c4" ||
		md.Annotations["org.opencontainers.image.ref.name"] != "0.0.0-git1a2b3c4" || md.Platform == nil || md.Platform.Architecture != "amd64" {
		t.Errorf("index entry: %+v", md)
	}
	var man Manifest
	if err := json.Unmarshal(blob(t, files, md), &man); err != nil {
		t.Fatal(err)
	}
	if man.MediaType != MediaTypeManifest || man.Config.MediaType != MediaTypeConfig || len(man.Layers) != 1 {
		t.Fatalf("manifest: %+v", man)
	}
	var cfg Config
	if err := json.Unmarshal(blob(t, files, man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	gz := blob(t, files, man.Layers[0])
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	layer, _ := io.ReadAll(zr)
	if cfg.RootFS.Type != "layers" || !slices.Equal(cfg.RootFS.DiffIDs, []string{digest(layer)}) {
		t.Errorf("rootfs %+v, layer diff id %s", cfg.RootFS, digest(layer))
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || !slices.Equal(cfg.Config.Entrypoint, []string{"/usr/bin/deptrace"}) ||
		!slices.Equal(cfg.Config.Cmd, []string{"agent"}) || cfg.Created != "2023-11-14T22:13:20Z" {
		t.Errorf("config: %+v", cfg)
	}
	want := map[string]string{
		"org.opencontainers.image.version":  "0.0.0~git1a2b3c4",
		"org.opencontainers.image.revision": "1a2b3c4d",
		"org.opencontainers.image.source":   "https://github.com/deptrace/deptrace",
		"org.opencontainers.image.created":  "2023-11-14T22:13:20Z",
	}
	for k, v := range want {
		if cfg.Config.Labels[k] != v || man.Annotations[k] != v {
			t.Errorf("%s: label %q, annotation %q, want %q", k, cfg.Config.Labels[k], man.Annotations[k], v)
		}
	}
	inLayer := untar(t, layer)
	if !bytes.Equal(inLayer["usr/bin/deptrace"], img.Binary) || len(inLayer) != 1 {
		t.Errorf("layer files: %d (want only usr/bin/deptrace)", len(inLayer))
	}

	var dm []DockerManifest
	if err := json.Unmarshal(files["manifest.json"], &dm); err != nil {
		t.Fatal(err)
	}
	if len(dm) != 1 || dm[0].Config != blobPath(man.Config.Digest) || !slices.Equal(dm[0].Layers, []string{blobPath(man.Layers[0].Digest)}) ||
		!slices.Equal(dm[0].RepoTags, []string{"deptrace/deptrace:0.0.0-git1a2b3c4"}) {
		t.Errorf("manifest.json: %+v", dm)
	}
}

// The same inputs give the same bytes.
func TestWriteReproducible(t *testing.T) {
	var a, b bytes.Buffer
	if err := Write(&a, testImage()); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, testImage()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two writes of one image differ")
	}
}

func TestTag(t *testing.T) {
	for in, want := range map[string]string{
		"1.2.3": "1.2.3", "0.0.0~gitabc": "0.0.0-gitabc", "1.0+dfsg": "1.0-dfsg", "~x": "v-x",
	} {
		if got := Tag(in); got != want {
			t.Errorf("Tag(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestWriteRefusesMissingFields(t *testing.T) {
	img := testImage()
	img.Binary = nil
	if err := Write(io.Discard, img); err == nil {
		t.Error("no error without a binary")
	}
}
